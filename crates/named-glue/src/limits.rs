//! The process's limit on open files. A replica holds about two sockets per zone (for each
//! zone's background signing service) besides its peers and clients, so 1,000 zones need more than the soft limit of 1024 most shells start with
//! (docs/BENCHMARKS.md, "1,000 zones"). As named does for itself, a replica raises its soft
//! limit to the hard one at start; the hard limit stays the operator's to set
//! (`LimitNOFILE=` in the systemd unit, `ulimit -Hn`).

use std::io;

/// Raises the soft limit on open files to the hard limit. Returns (soft before, soft now).
pub fn raise_open_files() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one rlimit struct, which `limit` is, and keeps no pointer.
    #[allow(unsafe_code)]
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit(2) reads one rlimit struct and keeps no pointer; raising the soft
        // limit up to the hard one needs no privilege.
        #[allow(unsafe_code)]
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, limit.rlim_cur))
}
