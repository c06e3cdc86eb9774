//! Signals to other processes by pid (kill(2)): the one place the workspace sends them, so the
//! `unsafe` call and why it is sound are written once. Used for named (the supervisor) and by
//! `sdns cluster down` for the replicas of a local cluster.

pub use libc::{SIGKILL, SIGTERM};

/// Sends `signal` to `pid`; `true` if it was delivered. Signal 0 only checks that the process
/// exists and may be signalled.
pub fn send(pid: i32, signal: i32) -> bool {
    if pid <= 0 {
        // 0 and negative pids address process groups (-1: every process we may signal).
        return false;
    }
    // SAFETY: kill(2) takes two integers and touches no memory of this process; the pid is
    // positive, so it addresses one process, never a group.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, signal) };
    rc == 0
}

/// Lets a command-line tool end quietly when its reader goes away (`sdns cluster status | head`),
/// as other Unix tools do, instead of panicking at the next print: Rust starts programs with
/// SIGPIPE ignored. Only for short-lived commands; a replica must never die of a closed pipe.
pub fn default_sigpipe() {
    // SAFETY: signal(2) with SIG_DFL installs no handler of ours (no code runs on delivery), and
    // it is called before any other thread could be writing.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether a process with this pid exists (and may be signalled by us).
pub fn alive(pid: i32) -> bool {
    send(pid, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_groups_are_never_signalled() {
        assert!(alive(std::process::id() as i32));
        assert!(!send(0, 0) && !send(-1, 0), "no process group is addressed");
    }

    #[test]
    fn a_child_is_terminated() {
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("sleep");
        let pid = child.id() as i32;
        assert!(alive(pid));
        assert!(send(pid, SIGTERM));
        let status = child.wait().expect("wait");
        assert!(!status.success(), "ended by the signal");
        assert!(!alive(pid), "reaped");
    }
}
