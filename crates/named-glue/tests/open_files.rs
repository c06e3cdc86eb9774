//! `limits::raise_open_files` in a process of its own (this test binary): the soft limit on
//! open files is lowered here and must not be under the other tests' feet.

use named_glue::limits::raise_open_files;

fn soft_and_hard() -> (u64, u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one rlimit struct, which `limit` is.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    (limit.rlim_cur, limit.rlim_max)
}

#[test]
fn a_low_soft_limit_is_raised_to_the_hard_one_and_more_files_open() {
    let (_, hard) = soft_and_hard();
    if hard < 512 {
        eprintln!("hard limit {hard}: too low to show anything here");
        return;
    }
    let low = libc::rlimit { rlim_cur: 64, rlim_max: hard };
    // SAFETY: setrlimit(2) reads one rlimit struct; lowering the soft limit needs no privilege.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) };
    assert_eq!(rc, 0);
    // At 64, a replica's two descriptors per zone run out before 32 zones.
    let opened: Vec<std::io::Result<std::fs::File>> = (0..100).map(|_| std::fs::File::open("/dev/null")).collect();
    assert!(opened.iter().any(|f| f.is_err()), "the lowered limit holds");
    drop(opened);

    assert_eq!(raise_open_files().unwrap(), (64, hard));
    assert_eq!(soft_and_hard(), (hard, hard));
    let files: Vec<std::fs::File> = (0..300).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    assert_eq!(files.len(), 300);
    // Already at the hard limit: nothing to do, and it says so.
    assert_eq!(raise_open_files().unwrap(), (hard, hard));
}
