//! BIND's command-line tools as the system tests drive them: the one place that spawns dig,
//! nsupdate and delv, for any server, zone and key. Every harness (a cluster of processes,
//! a Docker cluster, an adopted cluster, a plain named) goes through these.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::{run, text, tool};

/// dig's options when a test does not choose: no recursion (an authoritative server), and a
/// bounded wait (5 s, two tries) so that a dead server fails the test instead of hanging it.
pub const DIG_OPTS: &[&str] = &["+norec", "+time=5", "+tries=2"];

/// 127.0.0.1:`port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// `named` (Debian's or the patched build) in the foreground on IPv4 with one worker, reading
/// `conf`, its output into the file `log`; the caller kills it.
pub fn spawn_named(named: &Path, conf: &Path, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    Command::new(named)
        .args(["-g", "-4", "-n", "1", "-c"])
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", named.display()))
}

/// `dig @server -p port OPTS ARGS`: its whole output (stdout and stderr).
pub fn dig_at(server: SocketAddr, opts: &[&str], args: &[&str]) -> String {
    text(&run(Command::new(tool("dig")).arg(format!("@{}", server.ip())).arg("-p").arg(server.port().to_string()).args(opts).args(args)))
}

/// dig at 127.0.0.1:`port` with [`DIG_OPTS`].
pub fn dig(port: u16, args: &[&str]) -> String {
    dig_at(loopback(port), DIG_OPTS, args)
}

/// The records of a zone transfer as dig prints it (`+nocmd +nostats +nocomments`): no comment
/// or blank lines, and no TSIG record (its time and MAC are not zone content). `None` unless
/// the transfer is whole (it opens and closes with the SOA).
pub fn transfer_records(dig_output: &str) -> Option<Vec<String>> {
    let records: Vec<String> = dig_output
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty() && l.split_whitespace().nth(3).is_none_or(|t| t != "TSIG"))
        .map(str::to_string)
        .collect();
    let soas = records.iter().filter(|l| l.split_whitespace().nth(3) == Some("SOA")).count();
    (soas == 2).then_some(records)
}

/// One `nsupdate` run against one server for one zone; [`Nsupdate::send`] runs it.
#[derive(Clone, Debug)]
pub struct Nsupdate<'a> {
    server: SocketAddr,
    zone: &'a str,
    key: Option<&'a Path>,
    timeout_s: u32,
    once: bool,
}

impl<'a> Nsupdate<'a> {
    /// nsupdate at 127.0.0.1:`port` for `zone`, unsigned, with a 20 s timeout.
    pub fn to(port: u16, zone: &'a str) -> Nsupdate<'a> {
        Nsupdate::at(loopback(port), zone)
    }

    /// nsupdate at `server` for `zone`, unsigned, with a 20 s timeout.
    pub fn at(server: SocketAddr, zone: &'a str) -> Nsupdate<'a> {
        Nsupdate { server, zone, key: None, timeout_s: 20, once: false }
    }

    /// Signed with `-k key`: a TSIG key file or a SIG(0) `.private`.
    pub fn key(self, key: &'a Path) -> Nsupdate<'a> {
        self.key_opt(Some(key))
    }

    pub fn key_opt(mut self, key: Option<&'a Path>) -> Nsupdate<'a> {
        self.key = key;
        self
    }

    /// `-t`: how long nsupdate waits for the whole update.
    pub fn timeout_s(mut self, seconds: u32) -> Nsupdate<'a> {
        self.timeout_s = seconds;
        self
    }

    /// One UDP try and no retries of nsupdate's own (`-u T -r 0`): a retransmission is a second
    /// request, and a test that counts requests wants one per update.
    pub fn once(mut self) -> Nsupdate<'a> {
        self.once = true;
        self
    }

    /// Runs `server`, `zone`, the `commands` (one per line) and `send`: (success, output).
    pub fn send(&self, commands: &str) -> (bool, String) {
        let mut cmd = Command::new(tool("nsupdate"));
        if let Some(key) = self.key {
            cmd.arg("-k").arg(key);
        }
        let timeout = self.timeout_s.to_string();
        cmd.args(["-t", &timeout]);
        if self.once {
            cmd.args(["-u", &timeout, "-r", "0"]);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("nsupdate");
        let script = format!("server {} {}\nzone {}\n{commands}\nsend\n", self.server.ip(), self.server.port(), self.zone);
        child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write nsupdate script");
        let out = child.wait_with_output().expect("nsupdate output");
        (out.status.success(), text(&out))
    }
}

/// `delv -a ANCHOR @127.0.0.1 -p port NAME TYPE +root=ZONE`: validation from the zone's own
/// trust anchor, the way a validating resolver configured for the zone would.
pub fn delv(port: u16, anchor: &Path, name: &str, rtype: &str, root: &str) -> String {
    let root = format!("+root={}", root.trim_end_matches('.'));
    text(&run(Command::new(tool("delv")).arg("-a").arg(anchor).arg("@127.0.0.1").arg("-p").arg(port.to_string()).args([name, rtype, &root])))
}
