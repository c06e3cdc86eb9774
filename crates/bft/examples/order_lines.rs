//! Orders lines of text among replicas running as separate processes over loopback TLS.
//!
//! ```text
//! # dealer: CA and one certificate per replica (keys 0600)
//! order_lines --gen-certs DIR [--n 4]
//! # one process per replica; the i-th address is replica i's
//! order_lines --id I --certs DIR --peers 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 \
//!     [--generate K] [--expect M] [--linger-ms 1500]
//! ```
//! Without `--generate`, every stdin line is submitted at this replica; with it, K lines
//! `line <I>.<k>` are generated. Each delivered request prints as
//! `seq T origin:client:number text`. With `--expect M` the process exits after delivering M
//! requests (lingering a moment so its last messages reach the others); otherwise it runs until
//! killed.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bft::transport::driver::{now, spawn_replica};
use bft::{Config, Replica, Request};
use mesh::pki::write_cluster_pki;
use mesh::{Mesh, MeshConfig, CHANNEL_ORDERING};
use sha2::{Digest as _, Sha256};

struct Args {
    gen_certs: Option<PathBuf>,
    n: u16,
    id: u16,
    certs: PathBuf,
    peers: Vec<SocketAddr>,
    generate: Option<u64>,
    expect: Option<u64>,
    linger: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args =
        Args { gen_certs: None, n: 4, id: 0, certs: PathBuf::from("."), peers: Vec::new(), generate: None, expect: None, linger: Duration::from_millis(1500) };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--gen-certs" => args.gen_certs = Some(PathBuf::from(value()?)),
            "--n" => args.n = value()?.parse().map_err(|e| format!("--n: {e}"))?,
            "--id" => args.id = value()?.parse().map_err(|e| format!("--id: {e}"))?,
            "--certs" => args.certs = PathBuf::from(value()?),
            "--peers" => args.peers = value()?.split(',').map(|a| a.parse().map_err(|e| format!("--peers {a}: {e}"))).collect::<Result<_, _>>()?,
            "--generate" => args.generate = Some(value()?.parse().map_err(|e| format!("--generate: {e}"))?),
            "--expect" => args.expect = Some(value()?.parse().map_err(|e| format!("--expect: {e}"))?),
            "--linger-ms" => args.linger = Duration::from_millis(value()?.parse().map_err(|e| format!("--linger-ms: {e}"))?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

fn read(path: PathBuf) -> Result<String, String> {
    std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("order_lines: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    if let Some(dir) = args.gen_certs {
        write_cluster_pki(&dir, "order-lines", args.n).map_err(|e| e.to_string())?;
        eprintln!("wrote CA and {} replica certificates to {}", args.n, dir.display());
        return Ok(());
    }
    let n = u16::try_from(args.peers.len()).map_err(|_| "too many peers")?;
    let listen = *args.peers.get(usize::from(args.id)).ok_or("--id is not an index into --peers")?;
    let peers = (0..n).filter(|&p| p != args.id).map(|p| (p, args.peers[usize::from(p)])).collect();
    let config = Config::new(n, args.id);
    let mut mesh_config = MeshConfig::new(
        args.id,
        listen,
        peers,
        read(args.certs.join("ca.pem"))?,
        read(args.certs.join(format!("replica-{}.pem", args.id)))?,
        read(args.certs.join(format!("replica-{}.key", args.id)))?,
    );
    // Every message the core may legitimately send must fit in one frame.
    mesh_config.max_frame_bytes = config.max_message_bytes;
    let mesh = Mesh::start(mesh_config).await.map_err(|e| e.to_string())?;
    let incoming = mesh.subscribe(CHANNEL_ORDERING).map_err(|e| e.to_string())?;

    let replica = Replica::new(config, now()).map_err(|e| e.to_string())?;
    let (handle, mut batches) = spawn_replica(replica, mesh.sender(), incoming);

    let submit = handle.submit.clone();
    let id = args.id;
    let generate = args.generate;
    // Lines come from a blocking reader thread (stdin) or a generator.
    std::thread::spawn(move || {
        let mut number = 0u64;
        let mut push = |text: String| {
            number += 1;
            let request = Request { origin: id, client: 1, number, payload: text.into_bytes() };
            submit.blocking_send(request).is_ok()
        };
        match generate {
            Some(count) => {
                for k in 1..=count {
                    if !push(format!("line {id}.{k}")) {
                        return;
                    }
                }
            }
            None => {
                for line in std::io::stdin().lock().lines() {
                    let Ok(line) = line else { return };
                    if !push(line) {
                        return;
                    }
                }
            }
        }
    });

    let mut delivered = 0u64;
    let mut state = [0u8; 32];
    let stdout = std::io::stdout();
    while let Some(batch) = batches.recv().await {
        let mut out = stdout.lock();
        let mut hasher = Sha256::new();
        hasher.update(state);
        hasher.update(batch.seq.to_be_bytes());
        hasher.update(batch.time.0.to_be_bytes());
        for request in &batch.requests {
            let text = String::from_utf8_lossy(&request.payload);
            let _ = writeln!(out, "{} {} {}:{}:{} {}", batch.seq, batch.time.0, request.origin, request.client, request.number, text);
            hasher.update(request.origin.to_be_bytes());
            hasher.update(request.client.to_be_bytes());
            hasher.update(request.number.to_be_bytes());
            hasher.update((request.payload.len() as u64).to_be_bytes());
            hasher.update(&request.payload);
        }
        let _ = out.flush();
        state = hasher.finalize().into();
        if batch.checkpoint_due {
            let _ = handle.checkpoint.send((batch.seq, state)).await;
        }
        delivered += batch.requests.len() as u64;
        if args.expect.is_some_and(|m| delivered >= m) {
            tokio::time::sleep(args.linger).await;
            break;
        }
    }
    mesh.shutdown().await;
    Ok(())
}
