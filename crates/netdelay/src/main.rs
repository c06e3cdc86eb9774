//! `netdelay [--seed N] LINKS_FILE`: serve every link of the file until SIGTERM or Ctrl-C.
//!
//! Prints `netdelay: ready, N links` on stdout once every listen address is bound, so a script
//! can wait for it (scripts/bench-table2.sh does).

use std::io::Write;
use std::process::ExitCode;

use netdelay::spec::{self, Proto};
use netdelay::{tcp, udp, Rng};

const USAGE: &str = "usage: netdelay [--seed N] LINKS_FILE\n  each line: proto(tcp|udp) listen target delay_ms [jitter_ms [loss]]";

fn main() -> ExitCode {
    let mut seed = 1u64;
    let mut file = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => match args.next().and_then(|s| s.parse().ok()) {
                Some(s) => seed = s,
                None => return fail("--seed needs a number"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if file.is_none() && !a.starts_with('-') => file = Some(a),
            _ => return fail(&format!("unexpected argument {a:?}")),
        }
    }
    let Some(file) = file else { return fail("no links file") };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => return fail(&format!("{file}: {e}")),
    };
    let links = match spec::parse(&text) {
        Ok(l) => l,
        Err(e) => return fail(&format!("{file}: {e}")),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("runtime: {e}")),
    };
    rt.block_on(async move {
        let root = Rng::new(seed);
        for (k, l) in links.iter().enumerate() {
            let rng = root.derive(k as u64);
            let bound = match l.proto {
                Proto::Tcp => tcp::start(tcp::TcpLink::new(l.listen, l.target, l.shape), rng).await,
                Proto::Udp => udp::start(udp::UdpLink::new(l.listen, l.target, l.shape), rng).await,
            };
            if let Err(e) = bound {
                return fail(&format!("binding {:?} {}: {e}", l.proto, l.listen));
            }
        }
        println!("netdelay: ready, {} links", links.len());
        let _ = std::io::stdout().flush();
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => return fail(&format!("signal handler: {e}")),
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        ExitCode::SUCCESS
    })
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("netdelay: {msg}\n{USAGE}");
    ExitCode::FAILURE
}
