//! Ordering throughput and latency of the PBFT core driven over the network.
//!
//! ```text
//! cargo run --release -p bft --features transport --example bench_net -- \
//!     [--transport all|tls-procs|tls|memory] [--seconds 5] [--window 256] [--payload 32] \
//!     [--batch-max 512] [--batch-delay-us 2000] [--latency-replicas 4]
//! ```
//! Each run has two phases with n = 4 replicas:
//! - latency: each of the first `--latency-replicas` replicas keeps one request of its own
//!   outstanding (low load; 1 = only the primary submits); the figure is
//!   submit-to-local-delivery time at the submitting replica, p50/p99 over all replicas;
//! - throughput: every replica keeps `--window` requests outstanding (one per client, so the
//!   dedup window never interferes); the figure is requests delivered per second at the
//!   slowest replica.
//!
//! Transports: `tls-procs` runs 4 processes over loopback TLS (the issue's setting), `tls`
//! runs the 4 replicas as tasks in one process over the same TLS mesh, `memory` replaces the
//! mesh with in-memory channels (same driver, same encode/decode): the baseline. `all` runs
//! memory, tls and tls-procs in turn and prints each as a ratio to memory. Every run ends with
//! the mesh's own round-trip time (ping-pong between two meshes) and one-way frame rate (one
//! link streaming 32-byte frames), for reading the ordering figures against.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bft::transport::driver::{local_network, now, spawn_replica, ReplicaHandle};
use bft::{Batch, Config, Replica, Request};
use mesh::pki::write_cluster_pki;
use mesh::{Mesh, MeshConfig, CHANNEL_ORDERING};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

const N: u16 = 4;

#[derive(Clone, Debug)]
struct Plan {
    seconds: u64,
    window: u64,
    payload: usize,
    batch_max: usize,
    batch_delay_us: u64,
    /// Replicas 0..latency_replicas submit during the latency phase (one request each).
    latency_replicas: u16,
    /// Unix milliseconds at which the latency phase starts, the same for every replica.
    start_unix_ms: u64,
}

#[derive(Debug, Default, Clone)]
struct Outcome {
    latency_us: Vec<u64>,
    throughput_rps: f64,
    loaded_latency_us: Vec<u64>,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn instant_at_unix_ms(at: u64) -> Instant {
    Instant::now() + Duration::from_millis(at.saturating_sub(unix_ms()))
}

fn core_config(id: u16, plan: &Plan) -> Config {
    let mut config = Config::new(N, id);
    config.batch_max_requests = plan.batch_max;
    config.batch_delay = Duration::from_micros(plan.batch_delay_us);
    config
}

/// The application state the checkpoints confirm: a hash chain over delivered batches.
fn fold_batch(state: [u8; 32], batch: &Batch) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(state);
    hasher.update(batch.seq.to_be_bytes());
    hasher.update(batch.time.0.to_be_bytes());
    hasher.update((batch.requests.len() as u64).to_be_bytes());
    for request in &batch.requests {
        hasher.update(request.origin.to_be_bytes());
        hasher.update(request.client.to_be_bytes());
        hasher.update(request.number.to_be_bytes());
        hasher.update(&request.payload);
    }
    hasher.finalize().into()
}

/// Drives one replica's share of the load and measures it; returns the outcome and the
/// application state (for checkpoints after the measurement).
async fn run_load(id: u16, handle: &ReplicaHandle, batches: &mut mpsc::UnboundedReceiver<Batch>, plan: &Plan) -> (Outcome, [u8; 32]) {
    let phase = Duration::from_secs(plan.seconds);
    let latency_start = instant_at_unix_ms(plan.start_unix_ms);
    let latency_end = latency_start + phase;
    let throughput_start = latency_end + Duration::from_millis(500);
    let throughput_end = throughput_start + phase;

    let payload = vec![b'x'; plan.payload];
    // Per client: the submit instant of its outstanding request, and its next number.
    let clients = plan.window.max(1) as usize;
    let mut outstanding: Vec<Option<Instant>> = vec![None; clients];
    let mut numbers = vec![0u64; clients];
    let mut state = [0u8; 32];
    let mut outcome = Outcome::default();
    let mut delivered_in_window = 0u64;

    let submit = |client: usize, numbers: &mut Vec<u64>| {
        numbers[client] += 1;
        Request { origin: id, client: client as u64, number: numbers[client], payload: payload.clone() }
    };

    loop {
        let now_i = Instant::now();
        if now_i >= throughput_end {
            break;
        }
        // How many clients are active in this phase.
        let active = if now_i < latency_start {
            0
        } else if now_i < latency_end {
            usize::from(id < plan.latency_replicas)
        } else if now_i >= throughput_start {
            clients
        } else {
            0
        };
        for (client, slot) in outstanding.iter_mut().enumerate().take(active) {
            if slot.is_none() {
                let request = submit(client, &mut numbers);
                *slot = Some(Instant::now());
                if handle.submit.send(request).await.is_err() {
                    return (outcome, state);
                }
            }
        }
        let wake = if now_i < latency_start { latency_start } else { now_i + Duration::from_millis(5) };
        let batch = tokio::select! {
            batch = batches.recv() => match batch { Some(b) => b, None => return (outcome, state) },
            _ = tokio::time::sleep_until(wake) => continue,
        };
        let at = Instant::now();
        for request in &batch.requests {
            if request.origin != id {
                continue;
            }
            let Some(slot) = outstanding.get_mut(request.client as usize) else { continue };
            if numbers[request.client as usize] != request.number {
                continue;
            }
            if let Some(sent) = slot.take() {
                let latency = at.duration_since(sent).as_micros() as u64;
                if sent >= latency_start && at <= latency_end {
                    outcome.latency_us.push(latency);
                } else if sent >= throughput_start && at <= throughput_end {
                    outcome.loaded_latency_us.push(latency);
                }
            }
        }
        state = fold_batch(state, &batch);
        if batch.checkpoint_due {
            let _ = handle.checkpoint.send((batch.seq, state)).await;
        }
        if at >= throughput_start && at <= throughput_end {
            delivered_in_window += batch.requests.len() as u64;
        }
    }
    outcome.throughput_rps = delivered_in_window as f64 / phase.as_secs_f64();
    (outcome, state)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

struct Summary {
    transport: String,
    latency_p50_us: u64,
    latency_p99_us: u64,
    latency_samples: usize,
    throughput_rps: f64,
    loaded_p50_us: u64,
    loaded_p99_us: u64,
}

fn summarize(transport: &str, outcomes: &[Outcome]) -> Summary {
    let mut latency: Vec<u64> = outcomes.iter().flat_map(|o| o.latency_us.iter().copied()).collect();
    let mut loaded: Vec<u64> = outcomes.iter().flat_map(|o| o.loaded_latency_us.iter().copied()).collect();
    latency.sort_unstable();
    loaded.sort_unstable();
    Summary {
        transport: transport.to_string(),
        latency_p50_us: percentile(&latency, 0.50),
        latency_p99_us: percentile(&latency, 0.99),
        latency_samples: latency.len(),
        throughput_rps: outcomes.iter().map(|o| o.throughput_rps).fold(f64::INFINITY, f64::min),
        loaded_p50_us: percentile(&loaded, 0.50),
        loaded_p99_us: percentile(&loaded, 0.99),
    }
}

fn mesh_config(id: u16, addrs: &[SocketAddr], certs: &Path) -> Result<MeshConfig, String> {
    let read = |name: String| std::fs::read_to_string(certs.join(&name)).map_err(|e| format!("{name}: {e}"));
    let peers = (0..N).filter(|&p| p != id).map(|p| (p, addrs[usize::from(p)])).collect();
    let mut config =
        MeshConfig::new(id, addrs[usize::from(id)], peers, read("ca.pem".into())?, read(format!("replica-{id}.pem"))?, read(format!("replica-{id}.key"))?);
    // Every message the core may legitimately send must fit in one frame.
    config.max_frame_bytes = Config::new(N, id).max_message_bytes;
    Ok(config)
}

/// Frames lost in the mesh, on stderr: losses make the protocol wait for retransmissions.
fn report_drops(mesh: &Mesh) {
    let status = mesh.peer_status();
    let sent_dropped: u64 = status.iter().map(|s| s.frames_dropped).sum();
    let received_dropped: u64 = status.iter().map(|s| s.frames_received_dropped).sum();
    let received: u64 = status.iter().map(|s| s.frames_received).sum();
    let connects: Vec<u64> = status.iter().map(|s| s.connects).collect();
    let errors: Vec<String> = status.iter().filter_map(|s| s.last_error.as_ref().map(|e| format!("{}: {e}", s.id))).collect();
    eprintln!(
        "replica {}: frames received {received}, dropped at send {sent_dropped}, at receive {received_dropped}; connects {connects:?}; errors {errors:?}",
        mesh.id()
    );
}

async fn wait_connected(mesh: &Mesh) {
    while !mesh.peer_status().iter().all(|s| s.connected) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Four replicas as tasks of this process, over TLS (`tls`) or in-memory channels (`memory`).
async fn run_in_process(transport: &str, plan: &Plan, certs: &Path) -> Result<Summary, String> {
    let mut setups = Vec::new();
    let mut meshes = Vec::new();
    if transport == "tls" {
        let addrs = free_addrs(N)?;
        for id in 0..N {
            let mesh = Mesh::start(mesh_config(id, &addrs, certs)?).await.map_err(|e| e.to_string())?;
            let incoming = mesh.subscribe(CHANNEL_ORDERING).map_err(|e| e.to_string())?;
            let replica = Replica::new(core_config(id, plan), now()).map_err(|e| e.to_string())?;
            setups.push(spawn_replica(replica, mesh.sender(), incoming));
            meshes.push(mesh);
        }
        for mesh in &meshes {
            wait_connected(mesh).await;
        }
    } else {
        for (id, (outbound, incoming)) in local_network(N, 65_536).into_iter().enumerate() {
            let id = id as u16;
            let replica = Replica::new(core_config(id, plan), now()).map_err(|e| e.to_string())?;
            setups.push(spawn_replica(replica, outbound, incoming));
        }
    }
    let mut plan = plan.clone();
    plan.start_unix_ms = unix_ms() + 500;
    let mut tasks = Vec::new();
    for (id, (handle, mut batches)) in setups.into_iter().enumerate() {
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move { run_load(id as u16, &handle, &mut batches, &plan).await.0 }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.map_err(|e| e.to_string())?);
    }
    for mesh in meshes {
        report_drops(&mesh);
        mesh.shutdown().await;
    }
    Ok(summarize(transport, &outcomes))
}

/// Round trips of one small frame between two meshes in this process: the transport's own
/// latency (two one-way hops), to read the ordering latency against.
async fn mesh_ping_pong(certs: &Path, rounds: usize) -> Result<(u64, u64), String> {
    let addrs = free_addrs(N)?;
    let mut meshes = Vec::new();
    for id in 0..2 {
        let mut config = mesh_config(id, &addrs, certs)?;
        config.peers.retain(|(peer, _)| *peer < 2);
        meshes.push(Mesh::start(config).await.map_err(|e| e.to_string())?);
    }
    let mut rx0 = meshes[0].subscribe(CHANNEL_ORDERING).map_err(|e| e.to_string())?;
    let mut rx1 = meshes[1].subscribe(CHANNEL_ORDERING).map_err(|e| e.to_string())?;
    for mesh in &meshes {
        wait_connected(mesh).await;
    }
    let echo_sender = meshes[1].sender();
    let echo = tokio::spawn(async move {
        while let Some((from, payload)) = rx1.recv().await {
            if echo_sender.send(from, CHANNEL_ORDERING, payload).is_err() {
                return;
            }
        }
    });
    let sender = meshes[0].sender();
    let payload = bytes::Bytes::from(vec![b'x'; 32]);
    let mut rtts = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        sender.send(1, CHANNEL_ORDERING, payload.clone()).map_err(|e| e.to_string())?;
        rx0.recv().await.ok_or("echo stopped")?;
        rtts.push(start.elapsed().as_micros() as u64);
    }
    echo.abort();
    for mesh in meshes {
        mesh.shutdown().await;
    }
    rtts.sort_unstable();
    Ok((percentile(&rtts, 0.5), percentile(&rtts, 0.99)))
}

/// One-way streaming of small frames from one mesh to another in this process, in chunks that
/// fit the send queue: the transport's raw frame rate, to read the ordering throughput against.
async fn mesh_stream(certs: &Path, frames: usize) -> Result<f64, String> {
    const CHUNK: usize = 2048;
    let addrs = free_addrs(N)?;
    let mut meshes = Vec::new();
    for id in 0..2 {
        let mut config = mesh_config(id, &addrs, certs)?;
        config.peers.retain(|(peer, _)| *peer < 2);
        config.queue_frames = 2 * CHUNK;
        meshes.push(Mesh::start(config).await.map_err(|e| e.to_string())?);
    }
    let mut rx1 = meshes[1].subscribe(CHANNEL_ORDERING).map_err(|e| e.to_string())?;
    for mesh in &meshes {
        wait_connected(mesh).await;
    }
    let sender = meshes[0].sender();
    let payload = bytes::Bytes::from(vec![b'x'; 32]);
    let start = Instant::now();
    let mut received = 0;
    while received < frames {
        for _ in 0..CHUNK {
            sender.send(1, CHANNEL_ORDERING, payload.clone()).map_err(|e| e.to_string())?;
        }
        for _ in 0..CHUNK {
            rx1.recv().await.ok_or("receiver stopped")?;
            received += 1;
        }
    }
    let rate = received as f64 / start.elapsed().as_secs_f64();
    for mesh in meshes {
        mesh.shutdown().await;
    }
    Ok(rate)
}

/// Four child processes of this binary over loopback TLS.
async fn run_processes(plan: &Plan, certs: &Path) -> Result<Summary, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let addrs = free_addrs(N)?;
    let peers = addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let start = unix_ms() + 3000;
    let mut children = Vec::new();
    for id in 0..N {
        let child = tokio::process::Command::new(&exe)
            .args(["--child", "--id", &id.to_string(), "--peers", &peers])
            .arg("--certs")
            .arg(certs)
            .args(["--seconds", &plan.seconds.to_string(), "--window", &plan.window.to_string()])
            .args(["--payload", &plan.payload.to_string(), "--batch-max", &plan.batch_max.to_string()])
            .args(["--batch-delay-us", &plan.batch_delay_us.to_string(), "--start-unix-ms", &start.to_string()])
            .args(["--latency-replicas", &plan.latency_replicas.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning child {id}: {e}"))?;
        children.push(child);
    }
    let mut outcomes = Vec::new();
    for child in &mut children {
        let stdout = child.stdout.take().ok_or("child without stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next_line().await.map_err(|e| e.to_string())?.ok_or("child exited without a result")?;
        outcomes.push(parse_outcome(&line)?);
    }
    // Closing stdin tells the children to exit; every one has reported by now.
    for child in &mut children {
        drop(child.stdin.take());
    }
    for child in &mut children {
        let _ = child.wait().await;
    }
    Ok(summarize("tls-procs", &outcomes))
}

fn format_outcome(outcome: &Outcome) -> String {
    let join = |v: &[u64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    format!("RESULT {} {} {}", outcome.throughput_rps, join(&outcome.latency_us), join(&outcome.loaded_latency_us))
}

fn parse_outcome(line: &str) -> Result<Outcome, String> {
    let mut parts = line.split(' ');
    if parts.next() != Some("RESULT") {
        return Err(format!("unexpected child output: {line}"));
    }
    let throughput_rps = parts.next().and_then(|t| t.parse().ok()).ok_or("bad throughput")?;
    let list = |s: Option<&str>| -> Vec<u64> { s.unwrap_or("").split(',').filter(|x| !x.is_empty()).filter_map(|x| x.parse().ok()).collect() };
    Ok(Outcome { throughput_rps, latency_us: list(parts.next()), loaded_latency_us: list(parts.next()) })
}

async fn child_main(id: u16, peers: Vec<SocketAddr>, certs: PathBuf, plan: Plan) -> Result<(), String> {
    let mesh = Mesh::start(mesh_config(id, &peers, &certs)?).await.map_err(|e| e.to_string())?;
    let incoming = mesh.subscribe(CHANNEL_ORDERING).map_err(|e| e.to_string())?;
    let replica = Replica::new(core_config(id, &plan), now()).map_err(|e| e.to_string())?;
    let (handle, mut batches) = spawn_replica(replica, mesh.sender(), incoming);
    wait_connected(&mesh).await;
    let (outcome, mut state) = run_load(id, &handle, &mut batches, &plan).await;
    println!("{}", format_outcome(&outcome));
    // Keep ordering and confirming checkpoints (others may still be in their phase) until the
    // parent closes stdin.
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            line = stdin.next_line() => if !matches!(line, Ok(Some(_))) { break },
            batch = batches.recv() => {
                let Some(batch) = batch else { break };
                state = fold_batch(state, &batch);
                if batch.checkpoint_due {
                    let _ = handle.checkpoint.send((batch.seq, state)).await;
                }
            }
        }
    }
    report_drops(&mesh);
    mesh.shutdown().await;
    Ok(())
}

/// Reserves `n` loopback ports by binding port 0, then releases them for the replicas. Another
/// process could take one in between; good enough for a benchmark.
fn free_addrs(n: u16) -> Result<Vec<SocketAddr>, String> {
    let listeners = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    listeners.iter().map(|l| l.local_addr().map_err(|e| e.to_string())).collect()
}

fn print_table(summaries: &[Summary]) {
    let base = summaries.iter().find(|s| s.transport == "memory");
    println!("| transport | low-load p50 (us) | low-load p99 (us) | samples | throughput (req/s) | loaded p50 (us) | loaded p99 (us) | throughput vs memory |");
    println!("|---|---|---|---|---|---|---|---|");
    for s in summaries {
        let ratio = base.map(|b| format!("{:.2}", s.throughput_rps / b.throughput_rps)).unwrap_or_else(|| "-".into());
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} |",
            s.transport, s.latency_p50_us, s.latency_p99_us, s.latency_samples, s.throughput_rps, s.loaded_p50_us, s.loaded_p99_us, ratio
        );
    }
}

struct Cli {
    transport: String,
    child: bool,
    id: u16,
    peers: Vec<SocketAddr>,
    certs: Option<PathBuf>,
    plan: Plan,
}

fn parse_cli() -> Result<Cli, String> {
    let mut cli = Cli {
        transport: "all".into(),
        child: false,
        id: 0,
        peers: Vec::new(),
        certs: None,
        plan: Plan { seconds: 5, window: 256, payload: 32, batch_max: 512, batch_delay_us: 2000, latency_replicas: N, start_unix_ms: 0 },
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--child" {
            cli.child = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--transport" => cli.transport = value,
            "--id" => cli.id = num(&value)? as u16,
            "--peers" => cli.peers = value.split(',').map(|a| a.parse().map_err(|e| format!("--peers: {e}"))).collect::<Result<_, _>>()?,
            "--certs" => cli.certs = Some(PathBuf::from(value)),
            "--seconds" => cli.plan.seconds = num(&value)?,
            "--window" => cli.plan.window = num(&value)?,
            "--payload" => cli.plan.payload = num(&value)? as usize,
            "--batch-max" => cli.plan.batch_max = num(&value)? as usize,
            "--batch-delay-us" => cli.plan.batch_delay_us = num(&value)?,
            "--start-unix-ms" => cli.plan.start_unix_ms = num(&value)?,
            "--latency-replicas" => cli.plan.latency_replicas = num(&value)? as u16,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(cli)
}

fn main() {
    let result = parse_cli().and_then(|cli| {
        if cli.child {
            // One scheduler thread per replica process: 4 processes share the 2 cores.
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            let certs = cli.certs.clone().ok_or("--certs missing")?;
            runtime.block_on(child_main(cli.id, cli.peers.clone(), certs, cli.plan.clone()))
        } else {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
            runtime.block_on(parent_main(cli))
        }
    });
    if let Err(e) = result {
        eprintln!("bench_net: {e}");
        std::process::exit(1);
    }
}

async fn parent_main(cli: Cli) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("bench_net-{}", std::process::id()));
    write_cluster_pki(&dir, "bench", N).map_err(|e| e.to_string())?;
    let transports: Vec<&str> = match cli.transport.as_str() {
        "all" => vec!["memory", "tls", "tls-procs"],
        "memory" | "tls" | "tls-procs" => vec![cli.transport.as_str()],
        other => return Err(format!("unknown transport {other}")),
    };
    eprintln!("plan: {:?}", cli.plan);
    let mut summaries = Vec::new();
    for transport in transports {
        let summary = if transport == "tls-procs" { run_processes(&cli.plan, &dir).await? } else { run_in_process(transport, &cli.plan, &dir).await? };
        summaries.push(summary);
    }
    let (rtt_p50, rtt_p99) = mesh_ping_pong(&dir, 2000).await?;
    print_table(&summaries);
    let stream_rate = mesh_stream(&dir, 400_000).await?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("\nmesh round trip (2 one-way TLS hops, 32-byte frame, in-process): p50 {rtt_p50} us, p99 {rtt_p99} us");
    println!("mesh one-way stream (32-byte frames, one link, in-process): {stream_rate:.0} frames/s");
    Ok(())
}
