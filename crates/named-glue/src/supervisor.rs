//! named as a supervised child: start in the foreground (`-g`), ready check
//! (the zone's SOA answers over UDP), log capture (file and tracing), clean
//! stop (SIGTERM, then SIGKILL after a grace period), restart on crash with
//! backoff, restart on demand, and a quick restart around replacing named's files.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::Name;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::forward::zone_answers;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SuperviseError {
    #[error("cannot start {path}: {source}")]
    Spawn { path: PathBuf, source: std::io::Error },
    #[error("named did not answer for its zone within {0:?} (see its log {1})")]
    NotReady(Duration, PathBuf),
    #[error("the supervisor task has ended")]
    Gone,
    #[error("port {0} is held by another process (not a named of this replica that could be stopped); refusing to start a second named on it")]
    PortHeld(SocketAddr),
}

/// How to run one named.
#[derive(Debug, Clone)]
pub struct NamedSpec {
    pub named: PathBuf,
    pub conf: PathBuf,
    /// Where named listens (must match the configuration).
    pub listen: SocketAddr,
    pub zone: Name,
    /// named's stderr is appended here.
    pub log_file: PathBuf,
    /// Passed to named as SDNS_SIGNER_SOCKET.
    pub signer_socket: Option<PathBuf>,
    /// named's pid file (from its configuration): a named left running by an earlier
    /// supervisor of this replica is found through it and stopped before a new one starts.
    pub pid_file: Option<PathBuf>,
    /// Passed as SDNS_SIGNER_RESEND_MS (named's default: 2000): how often named sends an
    /// unanswered signing request again. It waits for the reply without a deadline.
    pub signer_resend_ms: Option<u32>,
    /// named's worker threads (`-n`). A signature wait blocks one of them,
    /// so keep at least 2 for reads to be answered during a write.
    pub worker_threads: u32,
    pub ready_timeout: Duration,
    pub stop_grace: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl NamedSpec {
    pub fn new(named: PathBuf, conf: PathBuf, port: u16, zone: Name, log_file: PathBuf) -> Self {
        NamedSpec {
            named,
            conf,
            listen: SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port),
            zone,
            log_file,
            signer_socket: None,
            pid_file: None,
            signer_resend_ms: None,
            worker_threads: 2,
            ready_timeout: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
        }
    }
}

/// Work done on named's files while no named runs (see [`Supervisor::replace_files`]).
type FileWork = Box<dyn FnOnce() -> std::io::Result<()> + Send>;

enum Control {
    Restart(oneshot::Sender<()>),
    Replace(FileWork, oneshot::Sender<std::io::Result<()>>),
    Stop(oneshot::Sender<()>),
}

/// A running, supervised named. Dropping it kills named.
pub struct Supervisor {
    spec: NamedSpec,
    control: mpsc::Sender<Control>,
    pid: Arc<AtomicU32>,
    starts: Arc<AtomicU64>,
    task: Option<JoinHandle<()>>,
    /// The zone whose SOA tells that named is ready: `spec.zone` at start, then one that
    /// stays served when the zones named serves change (see [`Supervisor::set_ready_zone`]).
    ready_zone: std::sync::Mutex<Name>,
}

impl Supervisor {
    /// Starts named and waits until it answers for its zone.
    pub async fn start(spec: NamedSpec) -> Result<Self, SuperviseError> {
        let pid = Arc::new(AtomicU32::new(0));
        let starts = Arc::new(AtomicU64::new(0));
        claim_port(&spec).await?;
        // Spawn once here so that a bad binary path is reported at once.
        let child = spawn(&spec, &starts)?;
        pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
        let (control, rx) = mpsc::channel(4);
        let task = tokio::spawn(run(spec.clone(), child, rx, pid.clone(), starts.clone()));
        let ready_zone = std::sync::Mutex::new(spec.zone.clone());
        let supervisor = Supervisor { spec, control, pid, starts, task: Some(task), ready_zone };
        supervisor.wait_ready().await?;
        Ok(supervisor)
    }

    /// named is ready from now on when it answers for `zone` (the zones it serves changed,
    /// and the one it was asked for may be gone).
    pub fn set_ready_zone(&self, zone: Name) {
        *self.ready_zone.lock().unwrap_or_else(|e| e.into_inner()) = zone;
    }

    /// Waits until named answers for the zone, up to the ready timeout.
    pub async fn wait_ready(&self) -> Result<(), SuperviseError> {
        let deadline = tokio::time::Instant::now() + self.spec.ready_timeout;
        let zone = self.ready_zone.lock().unwrap_or_else(|e| e.into_inner()).clone();
        while tokio::time::Instant::now() < deadline {
            if let Ok(true) = zone_answers(self.spec.listen, &zone, Duration::from_millis(300)).await {
                return Ok(());
            }
            // Short pauses: installing a zone signed in the background holds reads until
            // named is back, and a check is one loopback connect and query.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(SuperviseError::NotReady(self.spec.ready_timeout, self.spec.log_file.clone()))
    }

    /// Whether the supervision task has ended. It runs until [`Self::stop`] or drop, so
    /// before that an end is a failure (a panic included): named is no longer restarted.
    pub fn has_stopped(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops named (SIGTERM, SIGKILL after the grace), starts it again and
    /// waits until it is ready.
    pub async fn restart(&self) -> Result<(), SuperviseError> {
        let (tx, rx) = oneshot::channel();
        self.control.send(Control::Restart(tx)).await.map_err(|_| SuperviseError::Gone)?;
        rx.await.map_err(|_| SuperviseError::Gone)?;
        self.wait_ready().await
    }

    /// Kills named (its state is being replaced), runs `work` (on named's files: nothing
    /// else writes them now), starts named again and waits until it is ready. named is
    /// started again even when `work` fails; its error is returned.
    pub async fn replace_files<F>(&self, work: F) -> Result<std::io::Result<()>, SuperviseError>
    where
        F: FnOnce() -> std::io::Result<()> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.control.send(Control::Replace(Box::new(work), tx)).await.map_err(|_| SuperviseError::Gone)?;
        let result = rx.await.map_err(|_| SuperviseError::Gone)?;
        self.wait_ready().await?;
        Ok(result)
    }

    /// Stops named and the supervision.
    pub async fn stop(mut self) {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// The current named's process id (0 while none runs).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// How many times named was started (1 + restarts).
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::SeqCst)
    }

    pub fn spec(&self) -> &NamedSpec {
        &self.spec
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let pid = self.pid.swap(0, Ordering::SeqCst);
            if pid != 0 {
                // The task may be gone without a runtime to run kill_on_drop.
                crate::signal::send(pid as i32, crate::signal::SIGKILL);
            }
        }
    }
}

/// True when something holds `addr` for UDP. named binds with SO_REUSEPORT, so a second named
/// would bind next to the first and share its traffic; a plain bind without it fails instead.
fn port_held(addr: SocketAddr) -> bool {
    matches!(std::net::UdpSocket::bind(addr), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
}

/// The pid in `pid_file` if that process is alive and runs the named binary of `spec`.
fn stale_named(spec: &NamedSpec) -> Option<libc::pid_t> {
    let text = std::fs::read_to_string(spec.pid_file.as_ref()?).ok()?;
    let pid: libc::pid_t = text.trim().parse().ok().filter(|p| *p > 1)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let ours = std::fs::canonicalize(&spec.named).ok()?;
    (exe == ours).then_some(pid)
}

/// Makes sure no other named serves this replica's port before one is started: a named left
/// behind by an earlier run of this replica (found through its pid file) is killed; anything
/// else holding the port is an error, never a second named beside it.
async fn claim_port(spec: &NamedSpec) -> Result<(), SuperviseError> {
    if !port_held(spec.listen) {
        return Ok(());
    }
    let Some(pid) = stale_named(spec) else {
        return Err(SuperviseError::PortHeld(spec.listen));
    };
    tracing::warn!(pid, port = spec.listen.port(), "a named of an earlier run still holds the port; stopping it");
    // The pid was just checked to run named.
    crate::signal::send(pid, crate::signal::SIGKILL);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while port_held(spec.listen) {
        if tokio::time::Instant::now() >= deadline {
            return Err(SuperviseError::PortHeld(spec.listen));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn spawn(spec: &NamedSpec, starts: &AtomicU64) -> Result<Child, SuperviseError> {
    let mut cmd = Command::new(&spec.named);
    cmd.arg("-g")
        .arg("-4")
        .arg("-n")
        .arg(spec.worker_threads.max(1).to_string())
        .arg("-c")
        .arg(&spec.conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.env_remove(crate::SIGNER_SOCKET_ENV);
    if let Some(socket) = &spec.signer_socket {
        cmd.env(crate::SIGNER_SOCKET_ENV, socket);
    }
    cmd.env_remove(crate::SIGNER_RESEND_ENV);
    if let Some(ms) = spec.signer_resend_ms {
        cmd.env(crate::SIGNER_RESEND_ENV, ms.to_string());
    }
    // named belongs to this process: when it dies (even by SIGKILL) the kernel kills named
    // too, so a restarted replica never finds its old named serving a zone nobody feeds,
    // and named's unbounded wait for a signature cannot outlive the signing service.
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| SuperviseError::Spawn { path: spec.named.clone(), source })?;
    starts.fetch_add(1, Ordering::SeqCst);
    if let Some(stderr) = child.stderr.take() {
        let log_file = spec.log_file.clone();
        tokio::spawn(async move {
            let mut file = tokio::fs::OpenOptions::new().create(true).append(true).open(&log_file).await.ok();
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "named", "{line}");
                if let Some(f) = file.as_mut() {
                    let _ = f.write_all(format!("{line}\n").as_bytes()).await;
                }
            }
        });
    }
    Ok(child)
}

async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        crate::signal::send(pid as i32, crate::signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
        tracing::warn!(pid, "named ignored SIGTERM; killing it");
    }
    let _ = child.kill().await;
}

async fn run(spec: NamedSpec, mut child: Child, mut control: mpsc::Receiver<Control>, pid: Arc<AtomicU32>, starts: Arc<AtomicU64>) {
    let mut backoff = spec.backoff_min;
    loop {
        let started = tokio::time::Instant::now();
        let restart_ack = tokio::select! {
            status = child.wait() => {
                pid.store(0, Ordering::SeqCst);
                tracing::warn!(?status, "named exited; restarting after {backoff:?}");
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = spec.backoff_min;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    cmd = control.recv() => match cmd {
                        Some(Control::Restart(ack)) => { let _ = ack.send(()); }
                        Some(Control::Replace(work, ack)) => { let _ = ack.send(work()); }
                        Some(Control::Stop(ack)) => { let _ = ack.send(()); return; }
                        None => return,
                    }
                }
                backoff = (backoff * 2).min(spec.backoff_max);
                None
            }
            cmd = control.recv() => match cmd {
                Some(Control::Restart(ack)) => {
                    terminate(&mut child, spec.stop_grace).await;
                    pid.store(0, Ordering::SeqCst);
                    backoff = spec.backoff_min;
                    Some(ack)
                }
                Some(Control::Replace(work, ack)) => {
                    let stopping = std::time::Instant::now();
                    // Killed, not asked to stop: the files it would flush are about to be
                    // replaced, and every write it acknowledged is in its journal already.
                    // Its clean shutdown (freeing the zone) held an installation's reads.
                    let _ = child.kill().await;
                    pid.store(0, Ordering::SeqCst);
                    backoff = spec.backoff_min;
                    let stopped = stopping.elapsed();
                    let _ = ack.send(work());
                    // Where a replacement's time goes (the read gap of an installation).
                    tracing::info!(
                        stop_ms = stopped.as_millis() as u64,
                        work_ms = (stopping.elapsed() - stopped).as_millis() as u64,
                        "named stopped and its files replaced; starting it again"
                    );
                    None
                }
                Some(Control::Stop(ack)) => {
                    terminate(&mut child, spec.stop_grace).await;
                    pid.store(0, Ordering::SeqCst);
                    let _ = ack.send(());
                    return;
                }
                None => {
                    terminate(&mut child, spec.stop_grace).await;
                    pid.store(0, Ordering::SeqCst);
                    return;
                }
            },
        };
        loop {
            match spawn(&spec, &starts) {
                Ok(new) => {
                    child = new;
                    pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot restart named; retrying after {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(spec.backoff_max);
                }
            }
        }
        if let Some(ack) = restart_ack {
            let _ = ack.send(());
        }
    }
}

/// The child gets SIGKILL when this process dies (even by SIGKILL). named and
/// dnssec-signzone wait for signatures without a deadline; this bounds the wait by the
/// life of the process that serves them.
pub(crate) fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and only calls the
    // async-signal-safe prctl(2) and getppid(2).
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other("parent exited while the child was starting"));
            }
            Ok(())
        });
    }
}
