//! The tokio driver runs the PBFT core among 4 replicas (4 tasks) over real loopback TLS, and
//! over the in-memory network; every replica must deliver the same sequence.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use bft::transport::driver::{local_network, now, spawn_replica, Outbound, ReplicaHandle};
use bft::{Batch, Config, Replica, Request, RequestKey, Time};
use bytes::Bytes;
use mesh::pki::{generate_ca, issue_replica_cert};
use mesh::{Mesh, MeshConfig, CHANNEL_ORDERING};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;

const N: u16 = 4;
const PER_REPLICA: u64 = 40;
/// Liveness bound only (the machine is shared); ordering 160 requests takes milliseconds.
const EVENTUALLY: Duration = Duration::from_secs(60);

/// What one replica delivered: (seq, agreed time, request keys) per batch.
type Delivered = Vec<(u64, Time, Vec<RequestKey>)>;

/// Consumes deliveries like an application would: confirms checkpoints with a digest of what it
/// executed, and stops after `total` requests.
async fn collect(handle: ReplicaHandle, mut batches: mpsc::UnboundedReceiver<Batch>, total: u64) -> Delivered {
    let mut delivered = Delivered::new();
    let mut count = 0;
    let mut digest = [0u8; 32];
    while count < total {
        let batch = batches.recv().await.expect("driver stopped");
        count += batch.requests.len() as u64;
        // A toy state digest: identical on every honest replica because batches are.
        digest[..8].copy_from_slice(&batch.seq.to_be_bytes());
        digest[8..16].copy_from_slice(&count.to_be_bytes());
        if batch.checkpoint_due {
            handle.checkpoint.send((batch.seq, digest)).await.unwrap();
        }
        delivered.push((batch.seq, batch.time, batch.requests.iter().map(|r| r.key()).collect()));
    }
    // Keep the replica alive a moment so its last messages reach the others.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(handle);
    delivered
}

fn check_agreement(all: &[Delivered]) {
    let total = u64::from(N) * PER_REPLICA;
    for (id, delivered) in all.iter().enumerate() {
        assert_eq!(delivered, &all[0], "replica {id} delivered a different sequence than replica 0");
        let keys: Vec<RequestKey> = delivered.iter().flat_map(|(_, _, k)| k.iter().copied()).collect();
        let unique: HashSet<RequestKey> = keys.iter().copied().collect();
        assert_eq!(keys.len() as u64, total, "replica {id}");
        assert_eq!(unique.len(), keys.len(), "replica {id} delivered a request twice");
        for origin in 0..N {
            for number in 1..=PER_REPLICA {
                assert!(unique.contains(&RequestKey { origin, client: 7, number }));
            }
        }
        for pair in delivered.windows(2) {
            assert_eq!(pair[1].0, pair[0].0 + 1, "sequence gap");
            assert!(pair[1].1 > pair[0].1, "agreed time did not increase");
        }
    }
}

/// Submits PER_REPLICA requests at every replica, then collects.
async fn order_everywhere(setups: Vec<(ReplicaHandle, mpsc::UnboundedReceiver<Batch>)>) -> Vec<Delivered> {
    let total = u64::from(N) * PER_REPLICA;
    let mut tasks = Vec::new();
    for (id, (handle, batches)) in setups.into_iter().enumerate() {
        let submit = handle.submit.clone();
        tokio::spawn(async move {
            for number in 1..=PER_REPLICA {
                let request = Request { origin: id as u16, client: 7, number, payload: format!("{id}/{number}").into_bytes() };
                if submit.send(request).await.is_err() {
                    return;
                }
            }
        });
        tasks.push(tokio::spawn(collect(handle, batches, total)));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(timeout(EVENTUALLY, task).await.expect("replicas did not deliver in time").unwrap());
    }
    all
}

fn replica(id: u16) -> Replica {
    Replica::new(Config::new(N, id), now()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_over_tls_deliver_the_same_sequence() {
    let ca = generate_ca("driver-test").unwrap();
    let mut listeners = Vec::new();
    for _ in 0..N {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut meshes = Vec::new();
    let mut setups = Vec::new();
    for (id, listener) in listeners.into_iter().enumerate() {
        let id = id as u16;
        let cert = issue_replica_cert(&ca, id).unwrap();
        let peers = (0..N).filter(|&p| p != id).map(|p| (p, addrs[usize::from(p)])).collect();
        let mut cfg = MeshConfig::new(id, addrs[usize::from(id)], peers, ca.cert_pem.clone(), cert.cert_pem, cert.key_pem);
        cfg.max_frame_bytes = Config::new(N, id).max_message_bytes;
        let mesh = Mesh::start_with_listener(cfg, listener).await.unwrap();
        let incoming = mesh.subscribe(CHANNEL_ORDERING).unwrap();
        setups.push(spawn_replica(replica(id), mesh.sender(), incoming));
        meshes.push(mesh);
    }
    // Garbage from an authenticated peer is counted and ignored, not fatal.
    meshes[1].sender().send(0, CHANNEL_ORDERING, Bytes::from_static(b"\xff\x00garbage")).unwrap();
    let mut status0 = setups[0].0.status.clone();
    timeout(EVENTUALLY, status0.wait_for(|s| s.decode_errors >= 1)).await.expect("decode error not counted").unwrap();

    let all = order_everywhere(setups).await;
    check_agreement(&all);
    for mesh in meshes {
        mesh.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_over_memory_deliver_the_same_sequence() {
    let mut setups = Vec::new();
    for (id, (outbound, incoming)) in local_network(N, 4096).into_iter().enumerate() {
        setups.push(spawn_replica(replica(id as u16), outbound, incoming));
    }
    let all = order_everywhere(setups).await;
    check_agreement(&all);
}

#[tokio::test]
async fn local_network_routes_by_sender_and_never_to_self() {
    let mut net = local_network(3, 8);
    let (_, mut rx2) = net.pop().unwrap();
    let (_, mut rx1) = net.pop().unwrap();
    let (out0, mut rx0) = net.pop().unwrap();
    out0.broadcast(Bytes::from_static(b"b"));
    out0.send(2, Bytes::from_static(b"s"));
    assert_eq!(rx1.recv().await.unwrap(), (0, Bytes::from_static(b"b")));
    assert_eq!(rx2.recv().await.unwrap(), (0, Bytes::from_static(b"b")));
    assert_eq!(rx2.recv().await.unwrap(), (0, Bytes::from_static(b"s")));
    assert!(rx0.try_recv().is_err());
    assert!(rx1.try_recv().is_err());
}

/// One delivered batch as the tests compare it.
type Entry = (u64, Time, Vec<RequestKey>);
/// A running application: where to submit, what it delivered, its task.
type App = (mpsc::Sender<Request>, mpsc::UnboundedReceiver<Entry>, tokio::task::JoinHandle<()>);

/// Runs an application for one replica: confirms checkpoints, forwards what it delivered.
fn run_app(handle: ReplicaHandle, mut batches: mpsc::UnboundedReceiver<Batch>) -> App {
    let submit = handle.submit.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut count = 0u64;
        while let Some(batch) = batches.recv().await {
            count += batch.requests.len() as u64;
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(&batch.seq.to_be_bytes());
            digest[8..16].copy_from_slice(&count.to_be_bytes());
            if batch.checkpoint_due {
                let _ = handle.checkpoint.send((batch.seq, digest)).await;
            }
            if tx.send((batch.seq, batch.time, batch.requests.iter().map(|r| r.key()).collect())).is_err() {
                return;
            }
        }
    });
    (submit, rx, task)
}

async fn delivered_until(rx: &mut mpsc::UnboundedReceiver<Entry>, log: &mut Delivered, requests: usize) {
    while log.iter().map(|(_, _, k)| k.len()).sum::<usize>() < requests {
        let entry = timeout(EVENTUALLY, rx.recv()).await.expect("no delivery in time").expect("app stopped");
        log.push(entry);
    }
}

async fn start_replica(
    ca: &mesh::pki::CaBundle,
    id: u16,
    addrs: &[SocketAddr],
    listener: TcpListener,
) -> (Mesh, ReplicaHandle, mpsc::UnboundedReceiver<Batch>) {
    let cert = issue_replica_cert(ca, id).unwrap();
    let peers = (0..N).filter(|&p| p != id).map(|p| (p, addrs[usize::from(p)])).collect();
    let mut cfg = MeshConfig::new(id, addrs[usize::from(id)], peers, ca.cert_pem.clone(), cert.cert_pem, cert.key_pem);
    cfg.max_frame_bytes = Config::new(N, id).max_message_bytes;
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(200);
    let mesh = Mesh::start_with_listener(cfg, listener).await.unwrap();
    let incoming = mesh.subscribe(CHANNEL_ORDERING).unwrap();
    let (handle, batches) = spawn_replica(replica(id), mesh.sender(), incoming);
    (mesh, handle, batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_catches_up_over_tls() {
    let ca = generate_ca("restart-driver-test").unwrap();
    let mut listeners = Vec::new();
    for _ in 0..N {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut meshes = Vec::new();
    let mut apps = Vec::new();
    for (id, listener) in listeners.into_iter().enumerate() {
        let (mesh, handle, batches) = start_replica(&ca, id as u16, &addrs, listener).await;
        meshes.push(mesh);
        apps.push(run_app(handle, batches));
    }
    let mut logs: Vec<Delivered> = vec![Vec::new(); usize::from(N)];
    let submit = |apps: &Vec<App>, at: usize, numbers: std::ops::RangeInclusive<u64>| {
        let sender = apps[at].0.clone();
        async move {
            for number in numbers {
                let payload = vec![number as u8];
                sender.send(Request { origin: at as u16, client: 1, number, payload }).await.unwrap();
            }
        }
    };
    submit(&apps, 0, 1..=20).await;
    for (id, app) in apps.iter_mut().enumerate() {
        delivered_until(&mut app.1, &mut logs[id], 20).await;
    }

    // Replica 3 crashes and loses its state; the other three keep ordering.
    let crashed = meshes.pop().unwrap();
    crashed.shutdown().await;
    let (_, _, task) = apps.pop().unwrap();
    task.abort();
    submit(&apps, 1, 1..=20).await;
    for (id, app) in apps.iter_mut().enumerate() {
        delivered_until(&mut app.1, &mut logs[id], 40).await;
    }

    // It comes back on the same address with a fresh replica and catches up from its peers.
    let listener = timeout(EVENTUALLY, async {
        loop {
            match TcpListener::bind(addrs[3]).await {
                Ok(l) => return l,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .unwrap();
    let (mesh, handle, batches) = start_replica(&ca, 3, &addrs, listener).await;
    meshes.push(mesh);
    apps.push(run_app(handle, batches));
    logs[3].clear();
    delivered_until(&mut apps[3].1, &mut logs[3], 40).await;
    for id in 0..3 {
        assert_eq!(logs[3], logs[id], "restarted replica delivered a different sequence than replica {id}");
    }
    for mesh in meshes {
        mesh.shutdown().await;
    }
}
