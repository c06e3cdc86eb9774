//! `sdns cluster up|down|status`: a whole cluster on this machine, for trying and testing.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use named_glue::signal;

use crate::keygen::{keygen, replica_dir, write_configs, ClusterParams};
use wrapper::metrics::Status;

fn pid_file(dir: &Path, i: u16) -> std::path::PathBuf {
    replica_dir(dir, i).join("sdns.pid")
}

fn alive(pid: i32) -> bool {
    signal::alive(pid)
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub fn up(p: &ClusterParams, dir: &Path) -> Result<()> {
    // With several zones each share is in its zone's directory.
    let first_share = match p.zones.as_slice() {
        [_] => replica_dir(dir, 0).join("share.json"),
        zones => replica_dir(dir, 0).join(wrapper::config::zone_dir_name(&zones[0])).join("share.json"),
    };
    if !first_share.exists() {
        keygen(p, dir)?;
    } else {
        // The configs written below name --algorithm: the dealt key must be of it.
        let public = first_share.with_file_name("zone.pub.json");
        wrapper::files::ThresholdPublic::load(&public, p.algorithm)
            .with_context(|| format!("{} holds keys dealt for another --algorithm than {}; give that one, or use another --dir", dir.display(), p.algorithm))?;
        eprintln!("sdns cluster: using the keys in {}", dir.display());
    }
    let existing = (0..p.replicas).filter(|&i| !replica_dir(dir, i).exists()).collect::<Vec<_>>();
    if !existing.is_empty() {
        bail!("{} holds a cluster of another size (no replica-{}); use another --dir", dir.display(), existing[0]);
    }
    write_configs(p, dir)?;
    let exe = std::env::current_exe().context("locating the sdns binary")?;
    for i in 0..p.replicas {
        let rdir = replica_dir(dir, i);
        if let Some(pid) = read_pid(&pid_file(dir, i)).filter(|&pid| alive(pid)) {
            eprintln!("sdns cluster: replica {i} already running (pid {pid})");
            continue;
        }
        let log = std::fs::File::create(rdir.join("sdns.log")).context("replica log file")?;
        let child = Command::new(&exe)
            .arg("run")
            .arg("--config")
            .arg(rdir.join("replica.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C in this terminal must not stop the cluster.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting replica {i}"))?;
        std::fs::write(pid_file(dir, i), format!("{}\n", child.id()))?;
    }
    let zones = p.zones.iter().map(Name::from_ascii).collect::<Result<Vec<_>, _>>()?;
    // A Byzantine replica may never answer (silent, crashed) or hold a sign-zone request
    // forever: start-up waits for and asks only the others.
    let byzantine = |i: u16| p.byzantine.iter().find(|(id, _)| *id == i).map(|(_, m)| *m);
    for (i, mode) in &p.byzantine {
        eprintln!("sdns cluster: replica {i} is Byzantine ({mode}), a test cluster; not waited for");
    }
    let waited: Vec<u16> = (0..p.replicas).filter(|&i| byzantine(i).is_none()).collect();
    for &i in &waited {
        for zone in &zones {
            wait_answering(p.layout.client(i), zone, Duration::from_secs(90))
                .with_context(|| format!("replica {i} is not answering for {zone}; see {}", replica_dir(dir, i).join("sdns.log").display()))?;
        }
    }
    let marker = dir.join("signed");
    if !marker.exists() {
        eprintln!("sdns cluster: signing the zone with the distributed key (an ordered operation, asked by every replica) ...");
        let admins: Vec<SocketAddr> = waited.iter().map(|&i| p.layout.metrics(i)).collect();
        let tokens: Vec<std::path::PathBuf> = waited.iter().map(|&i| admin_token_file(dir, i)).collect();
        // Every zone, one ordered request each.
        let outcome = sign_zone(&admins, &tokens, None).context("sign-zone")?;
        eprintln!("sdns cluster: {}", outcome.replace('\n', "\nsdns cluster: "));
        std::fs::write(&marker, outcome.as_bytes())?;
    }
    for &i in &waited {
        for zone in &zones {
            wait_signed(p.layout.client(i), zone, Duration::from_secs(60)).with_context(|| format!("replica {i} does not serve the signed zone {zone}"))?;
        }
    }
    print_usage(p, dir);
    if !p.also_notify.is_empty() {
        print_secondaries(p);
    }
    if let Some(catalog) = &p.catalog_zone {
        print_catalog(p, catalog);
    }
    Ok(())
}

/// What the secondaries given with `--also-notify` need: every replica NOTIFYs them, so each
/// lists every replica's client address as a primary (a BIND secondary takes a NOTIFY only
/// from an address among its primaries, whatever the port).
fn print_secondaries(p: &ClusterParams) {
    let targets: Vec<String> = p.also_notify.iter().map(|a| a.to_string()).collect();
    let primaries: Vec<String> = (0..p.replicas).map(|i| p.layout.client(i)).map(|c| format!("{} port {};", c.ip(), c.port())).collect();
    let local = if p.layout.addresses.iter().all(|a| a.is_loopback()) { " (here: this machine's loopback addresses)" } else { "" };
    println!(
        "Secondaries NOTIFYed by every replica after each change: {}\n  \
         in their named.conf: primaries {{ {} }};\n  \
         they transfer with the transfer key, or from an address [access] allow_transfer lists{local}",
        targets.join(", "),
        primaries.join(" "),
    );
}

/// How a secondary consumes the catalog (BIND's syntax; README, "Secondaries").
fn print_catalog(p: &ClusterParams, catalog: &str) {
    let primaries: Vec<String> = (0..p.replicas).map(|i| p.layout.client(i)).map(|c| format!("{} port {} key \"sdns-transfer\";", c.ip(), c.port())).collect();
    println!(
        "Catalog zone {catalog} (RFC 9432) lists every zone; a BIND secondary provisions them from it\n\
         (include the dealer's transfer.key in its named.conf):\n  \
         options {{ catalog-zones {{ zone \"{catalog}\" default-primaries {{ {list} }}; }}; }};\n  \
         zone \"{catalog}\" {{ type secondary; file \"catalog.db\"; primaries {{ {list} }}; }};",
        list = primaries.join(" ")
    );
}

/// Finishes the double-KSK rollover of a zone adopted signed, on the cluster in `dir`: an
/// ordered update (signed with the dealer's update key of that zone) deletes the rollover
/// marker, then an ordered sign-zone signs the zone without the operator's KSK and its
/// signature. Both are ordered operations, so every replica's zone stays the same. In a
/// cluster adopted with several zones, `--zone` names the one zone to finish (its files are
/// in `zones/<zone>/`), and only that zone is signed.
pub fn rollover_finish(p: &ClusterParams, dir: &Path) -> Result<()> {
    p.one_zone("sdns cluster rollover-finish")?;
    let zone = crate::adopted::absolute_name(p.zone());
    let Some(records) = crate::adopted::Adopted::load_all(dir)? else {
        bail!("{} holds no rollover: it was not adopted from a signed zone", dir.display());
    };
    let several = records.len() > 1;
    if !records.iter().any(|a| crate::adopted::absolute_name(&a.zone) == zone) {
        let names: Vec<&str> = records.iter().map(|a| a.zone.as_str()).collect();
        bail!(
            "{} was adopted for zone{} {}; give {}--zone {}",
            dir.display(),
            if several { "s" } else { "" },
            names.join(", "),
            if several { "one of them with " } else { "" },
            names[0]
        );
    }
    let zdir = if several { PathBuf::from(wrapper::config::zone_dir_name(&zone)) } else { PathBuf::new() };
    if !dir.join(&zdir).join(crate::adopt::rollover::ROLLOVER_FILE).exists() {
        bail!("{} holds no rollover of {zone}: it was not adopted from a signed zone", dir.display());
    }
    let marker = crate::adopt::rollover::marker_name(&zone);
    let exe = std::env::current_exe().context("locating the sdns binary")?;
    let out = Command::new(&exe)
        .arg("update")
        .arg("--config")
        .arg(replica_dir(dir, 0).join("replica.toml"))
        .args(["--zone", &zone])
        .arg("-k")
        .arg(dir.join(&zdir).join("tsig.key"))
        .args(["delete", &marker, "TXT"])
        .output()
        .context("running sdns update")?;
    if !out.status.success() {
        bail!("deleting {marker} TXT failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    eprintln!("sdns cluster: {marker} TXT deleted (an ordered update); signing the zone without your old KSK ...");
    let waited: Vec<u16> = (0..p.replicas).filter(|&i| !p.byzantine.iter().any(|(id, _)| *id == i)).collect();
    let admins: Vec<SocketAddr> = waited.iter().map(|&i| p.layout.metrics(i)).collect();
    let tokens: Vec<std::path::PathBuf> = waited.iter().map(|&i| admin_token_file(dir, i)).collect();
    let outcome = sign_zone(&admins, &tokens, several.then_some(zone.as_str())).context("sign-zone")?;
    println!(
        "sdns cluster: rollover of {zone} finished ({}); now have the parent remove the old DS: {}",
        outcome.trim(),
        dir.join(&zdir).join(crate::adopt::rollover::OLD_DS_FILE).display()
    );
    Ok(())
}

fn print_usage(p: &ClusterParams, dir: &Path) {
    let c0 = p.layout.client(0);
    let c1 = p.layout.client(p.replicas.min(2) - 1);
    if p.zones.len() > 1 {
        // Each zone's keys and trust anchor are in its own directory of the dealing.
        println!("\nsdns: {} replicas serving {} zones (t = {}, protocol {:?}).", p.replicas, p.zones.len(), (p.replicas - 1) / 3, p.protocol);
        for z in &p.zones {
            let zone = z.trim_end_matches('.');
            let zdir = dir.join(wrapper::config::zone_dir_name(z));
            println!(
                "\nZone {zone} (its files in {zd}):\n  delv -a {anchor} @{ip} -p {port0} {zone} SOA +root={zone}\n  \
                 printf 'server {ip} {port1}\\nzone {zone}\\nupdate add new.{zone} 300 TXT hello\\nsend\\n' | nsupdate -k {key}",
                zd = zdir.display(),
                anchor = zdir.join("trust-anchor.conf").display(),
                key = zdir.join("tsig.key").display(),
                ip = c0.ip(),
                port0 = c0.port(),
                port1 = c1.port(),
            );
        }
        println!(
            "\nStatus and shutdown:\n  {sdns} cluster status --replicas {n} --dir {dir}{flags}\n  {sdns} cluster down --replicas {n} --dir {dir}{flags}",
            n = p.replicas,
            dir = dir.display(),
            sdns = sdns_command(),
            flags = locating_flags(p),
        );
        return;
    }
    let zone = p.zone().trim_end_matches('.');
    let tsig = dir.join("tsig.key");
    let anchor = dir.join("trust-anchor.conf");
    let transfer = dir.join("transfer.key");
    let sig0 = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|f| f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("Ksdns-update.") && n.ends_with(".private")));
    // In sig0 mode only the SIG(0) key authorizes updates; the shared TSIG key does not.
    let (how, key) = match (p.update_auth, &sig0) {
        (exec::auth::Mode::Tsig, _) | (_, None) => ("TSIG, a key every replica holds", tsig.clone()),
        (_, Some(k)) => ("SIG(0), a key no replica holds", k.clone()),
    };
    // An adopted zone: the operator's own key, under the operator's update-policy.
    let adopted_key = crate::adopted::Adopted::load(dir).ok().flatten().and_then(|a| a.tsig_keys.into_iter().find(|k| k != "tsig.key"));
    let (how, key) = match adopted_key {
        Some(k) if p.update_auth != exec::auth::Mode::Sig0 => ("TSIG, your own key; it may update what your update-policy grants", dir.join(k)),
        _ => (how, key),
    };
    println!(
        "\nsdns: {n} replicas serving {zone} (t = {t}, protocol {proto:?}).\n\n\
         Read through any replica:\n  dig @{ip} -p {port0} www.{zone} A +dnssec\n\
         Validate with the zone's trust anchor:\n  delv -a {anchor} @{ip} -p {port0} www.{zone} A +root={zone}\n\
         Update through another replica ({how}):\n  printf 'server {ip} {port1}\\nzone {zone}\\nupdate add new.{zone} 300 A 192.0.2.7\\nsend\\n' | nsupdate -k {key}\n\
         Transfer the zone (needs the transfer key):\n  dig -k {transfer} @{ip} -p {port0} {zone} AXFR\n\
         Status and shutdown:\n  {sdns} cluster status --replicas {n} --dir {dir}{flags}\n  {sdns} cluster down --replicas {n} --dir {dir}{flags}\n",
        n = p.replicas,
        t = (p.replicas - 1) / 3,
        proto = p.protocol,
        ip = c0.ip(),
        port0 = c0.port(),
        port1 = c1.port(),
        anchor = anchor.display(),
        key = key.display(),
        transfer = transfer.display(),
        dir = dir.display(),
        sdns = sdns_command(),
        flags = locating_flags(p),
    );
}

/// The flags that say where this cluster listens, where they differ from the
/// defaults: `cluster status` (and `down`) run with them find this cluster and not
/// another one on the default ports.
fn locating_flags(p: &ClusterParams) -> String {
    let d = crate::keygen::Layout::default();
    let l = &p.layout;
    let mut out = String::new();
    if p.zones.len() > 1 || p.zone().trim_end_matches('.') != "example.test" {
        for zone in &p.zones {
            out += &format!(" --zone {zone}");
        }
    }
    if l.addresses != d.addresses {
        out += &format!(" --addresses {}", l.addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(","));
    }
    for (flag, port, default) in [
        ("--client-port", l.client_port, d.client_port),
        ("--peer-port", l.peer_port, d.peer_port),
        ("--named-port", l.named_port, d.named_port),
        ("--metrics-port", l.metrics_port, d.metrics_port),
    ] {
        if port != default {
            out += &format!(" {flag} {port}");
        }
    }
    out
}

/// How to call this binary again: relative to the current directory when it is below it.
fn sdns_command() -> String {
    let exe = std::env::current_exe().unwrap_or_else(|_| "sdns".into());
    let cwd = std::env::current_dir().unwrap_or_default();
    exe.strip_prefix(&cwd).map(|p| p.display().to_string()).unwrap_or_else(|_| exe.display().to_string())
}

pub fn down(replicas: u16, dir: &Path) -> Result<()> {
    let mut stopped = 0;
    for i in 0..replicas {
        let pf = pid_file(dir, i);
        let Some(pid) = read_pid(&pf) else { continue };
        if alive(pid) {
            signal::send(pid, signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if alive(pid) {
                signal::send(pid, signal::SIGKILL);
            }
            stopped += 1;
        }
        let _ = std::fs::remove_file(&pf);
        // A named left behind by a killed wrapper.
        let named_pid = replica_dir(dir, i).join("state/named/named.pid");
        if let Some(pid) = read_pid(&named_pid).filter(|&p| alive(p)) {
            signal::send(pid, signal::SIGTERM);
        }
    }
    eprintln!("sdns cluster: stopped {stopped} replicas");
    Ok(())
}

pub fn status(p: &ClusterParams, dir: &Path) -> Result<bool> {
    println!(
        "{:>7} {:>6} {:>5} {:>7} {:>8} {:>10} {:>6} {:>6}  {:<13} re-signing",
        "replica", "pid", "view", "primary", "executed", "checkpoint", "peers", "named", "health"
    );
    let mut all_ok = true;
    let mut reports = Vec::new();
    let rows: Vec<(Option<i32>, Option<Status>)> = (0..p.replicas)
        .map(|i| {
            let pid = read_pid(&pid_file(dir, i)).filter(|&pid| alive(pid));
            let mut status: Option<Status> = wrapper::endpoint::get(p.layout.metrics(i), "/status").ok().and_then(|b| serde_json::from_str(&b).ok());
            // Before its first checkpoint a replica has digested no serial: show the one it serves.
            for z in status.iter_mut().flat_map(|s| s.zones.iter_mut()).filter(|z| z.serial.is_none()) {
                z.serial = Name::from_ascii(&z.name).ok().and_then(|name| soa_serial(p.layout.client(i), &name));
            }
            (pid, status)
        })
        .collect();
    for (i, (pid, status)) in (0..p.replicas).zip(rows.iter().cloned()) {
        let answering = wait_answering(p.layout.client(i), &Name::from_ascii(p.zone())?, Duration::from_millis(1500)).is_ok();
        let others_stable =
            rows.iter().enumerate().filter(|(j, _)| *j != usize::from(i)).filter_map(|(_, (_, s))| s.as_ref().map(|s| s.stable_checkpoint)).max().unwrap_or(0);
        let health = match (pid, &status, answering) {
            (None, _, _) => "down".to_string(),
            (Some(_), None, _) => "starting".to_string(),
            (Some(_), Some(_), false) => "not answering".to_string(),
            (Some(_), Some(s), true) => s.disagreement(others_stable).unwrap_or_else(|| "ok".to_string()),
        };
        all_ok &= health == "ok";
        let s = status.unwrap_or_default();
        if pid.is_some() {
            reports.push((i, s.peer_faults.clone(), s.silent_peers.clone()));
        }
        // Incremental re-signing progress: signatures due of those in the zone, RRsets
        // re-signed so far, the rate while slices run and the time left at the slice pace.
        // A background whole-zone signing: RRsets signed of those the zone will hold, the
        // rate since it began and the time left at it.
        let resign = if let Some(z) = &s.zone_signing {
            let state =
                if z.signed { "signed here, installing once t+1 are done".to_string() } else { z.eta_s.map(|e| format!("eta {e} s")).unwrap_or_default() };
            format!("signing zone (seq {}): {}/{} RRsets, {:.1}/s, {state}", z.seq, z.done, z.total, z.rate)
        } else if s.rrsigs == 0 {
            "-".to_string()
        } else {
            let eta = s.resign_eta_s.map(|e| format!(", eta {e} s")).unwrap_or_default();
            format!("{}/{} due, {} done, {:.1}/s{eta}", s.rrsigs_due, s.rrsigs, s.resigned_rrsets, s.resign_rate)
        };
        println!(
            "{:>7} {:>6} {:>5} {:>7} {:>8} {:>10} {:>6} {:>6}  {:<13} {}",
            i,
            pid.map(|p| p.to_string()).unwrap_or("-".into()),
            s.view,
            s.primary,
            s.last_executed,
            s.stable_checkpoint,
            format!("{}/{}", s.peers_connected, p.replicas - 1),
            if s.named_running { "up" } else { "-" },
            health,
            resign
        );
    }
    for line in zone_lines(&rows.iter().enumerate().filter_map(|(i, (_, s))| Some((u16::try_from(i).ok()?, s.as_ref()?))).collect::<Vec<_>>()) {
        println!("{line}");
    }
    let accusations = attribution(&reports);
    if !accusations.is_empty() {
        println!("\nmisbehaviour seen by the running replicas:");
        for line in accusations {
            println!("  {line}");
        }
    }
    Ok(all_ok)
}

/// Per zone (the replicas' `/status` zones, by name): one line when the replicas that answered
/// agree on its serial and key tag, else one line per replica. Serials are read at each
/// replica's last checkpoint, so a replica a checkpoint behind may differ for a moment.
fn zone_lines(statuses: &[(u16, &Status)]) -> Vec<String> {
    let mut names: Vec<&str> = Vec::new();
    for (_, s) in statuses {
        for z in &s.zones {
            if !names.contains(&z.name.as_str()) {
                names.push(&z.name);
            }
        }
    }
    let serial = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    let mut out = Vec::new();
    if !names.is_empty() {
        out.push(String::new());
    }
    for name in names {
        let seen: Vec<(u16, &wrapper::metrics::ZoneStatus)> =
            statuses.iter().filter_map(|(i, s)| s.zones.iter().find(|z| z.name == name).map(|z| (*i, z))).collect();
        let Some((_, first)) = seen.first() else { continue };
        let signed = |z: &wrapper::metrics::ZoneStatus| {
            let running = z.signing_since.map(|seq| format!(", signing since seq {seq}")).unwrap_or_default();
            let at = |secs: u64| if secs == 0 { "-".to_string() } else { named_glue::time::format_rfc3339(secs) };
            format!("signed at {}, next re-signing from {}{running}", at(z.signed_at), at(z.next_resign_due))
        };
        let missing = statuses.len() - seen.len();
        if missing == 0 && seen.iter().all(|(_, z)| z.serial == first.serial && z.key_tag == first.key_tag) {
            out.push(format!("zone {name}: serial {}, key tag {}, {}", serial(first.serial), first.key_tag, signed(first)));
            continue;
        }
        out.push(format!("zone {name}: the replicas differ"));
        for (i, s) in statuses {
            match s.zones.iter().find(|z| z.name == name) {
                Some(z) => out.push(format!("  replica {i}: serial {}, key tag {}, {}", serial(z.serial), z.key_tag, signed(z))),
                None => out.push(format!("  replica {i}: does not serve it")),
            }
        }
    }
    out
}

/// One line per accused replica: what each running replica saw it do. A replica's report
/// about itself is left out (a Byzantine replica's report about others is its own word, so
/// every reporter is named).
fn attribution(reports: &[(u16, Vec<wrapper::metrics::PeerFault>, Vec<u16>)]) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut by_peer: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for (reporter, faults, silent) in reports {
        for f in faults.iter().filter(|f| f.peer != *reporter) {
            by_peer.entry(f.peer).or_default().push(format!("{} x{} (seen by {reporter})", f.kind, f.count));
        }
        for peer in silent.iter().filter(|p| *p != reporter) {
            by_peer.entry(*peer).or_default().push(format!("silent (seen by {reporter})"));
        }
    }
    by_peer.into_iter().map(|(peer, what)| format!("replica {peer}: {}", what.join(", "))).collect()
}

fn exchange_udp(addr: SocketAddr, request: &[u8], timeout: Duration) -> Result<Message> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(timeout))?;
    socket.send_to(request, addr)?;
    let mut buf = vec![0u8; 65535];
    let (len, _) = socket.recv_from(&mut buf)?;
    Ok(Message::from_vec(&buf[..len])?)
}

/// Until the replica answers an ordered SOA query for the zone.
fn wait_answering(addr: SocketAddr, zone: &Name, within: Duration) -> Result<()> {
    wait_for(addr, zone, RecordType::SOA, within, |m| m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty())
}

/// The SOA serial `addr` serves for `zone` now, if it answers within a moment.
fn soa_serial(addr: SocketAddr, zone: &Name) -> Option<u32> {
    let query = named_glue::forward::build_query(0x5e71, zone, RecordType::SOA).ok()?;
    let answer = exchange_udp(addr, &query, Duration::from_millis(700)).ok()?;
    answer.answers.iter().find_map(|r| match &r.data {
        hickory_proto::rr::RData::SOA(soa) => Some(soa.serial),
        _ => None,
    })
}

/// Until the replica serves the zone's DNSKEY (the zone is signed).
fn wait_signed(addr: SocketAddr, zone: &Name, within: Duration) -> Result<()> {
    wait_for(addr, zone, RecordType::DNSKEY, within, |m| m.answers.iter().any(|r| r.record_type() == RecordType::DNSKEY))
}

/// Asks `addr` for (zone, rtype) every 300 ms until an answer satisfies `done`.
fn wait_for(addr: SocketAddr, zone: &Name, rtype: RecordType, within: Duration, done: impl Fn(&Message) -> bool) -> Result<()> {
    let deadline = Instant::now() + within;
    // EDNS with room for a large DNSKEY RRset: replicas answer UDP as named does,
    // truncated to the size the query advertises (512 without EDNS).
    let mut query = Message::new(0x5d05, MessageType::Query, OpCode::Query);
    query.add_query(Query::query(zone.clone(), rtype));
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    query.set_edns(edns);
    let request = query.to_vec().context("building a query")?;
    loop {
        if exchange_udp(addr, &request, Duration::from_millis(700)).is_ok_and(|m| done(&m)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("no {rtype} answer from {addr} within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Where replica `i` of a local cluster writes its admin token.
pub fn admin_token_file(dir: &Path, i: u16) -> std::path::PathBuf {
    replica_dir(dir, i).join("state").join(wrapper::endpoint::ADMIN_TOKEN_FILE)
}

/// Reads an admin token file; a replica writes it as it starts, so wait a little for it.
pub(crate) fn read_token(path: &Path) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
            Ok(_) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Ok(_) => bail!("{} is empty", path.display()),
            Err(e) => return Err(e).with_context(|| format!("reading the admin token {}", path.display())),
        }
    }
}

/// Asks every replica in `admins` (with the token in the matching file of `tokens`) for
/// sign-zone at once, for `zone` or (`None`) every zone it serves, one request each. It runs
/// once t+1 replicas' requests were ordered; each replica's answer is printed. `Ok` with
/// the signing's outcome when one replica reports it ran (for every zone asked).
pub fn sign_zone(admins: &[SocketAddr], tokens: &[std::path::PathBuf], zone: Option<&str>) -> Result<String> {
    if admins.len() != tokens.len() || admins.is_empty() {
        bail!("give one --token file per --admin address ({} addresses, {} tokens)", admins.len(), tokens.len());
    }
    let tokens = tokens.iter().map(|t| read_token(t)).collect::<Result<Vec<_>>>()?;
    let path = match zone {
        Some(zone) => format!("/admin/sign-zone?zone={}", zone.trim_end_matches('.')),
        None => "/admin/sign-zone".to_string(),
    };
    let path = &path;
    let outcomes: Vec<Result<String>> = std::thread::scope(|s| {
        let asks: Vec<_> = admins.iter().zip(&tokens).map(|(&addr, token)| s.spawn(move || wrapper::endpoint::post(addr, path, token))).collect();
        asks.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the request thread panicked")))).collect()
    });
    // Per zone ("" with one: its answer is the outcome alone), the line of a replica that
    // reports it signed: several zones answer with one "zone <name>: <outcome>" line each.
    let mut zones: std::collections::BTreeMap<String, Option<String>> = std::collections::BTreeMap::new();
    let mut report = String::new();
    for (addr, outcome) in admins.iter().zip(&outcomes) {
        let line = match outcome {
            Ok(text) => text.clone(),
            Err(e) => format!("error: {e:#}"),
        };
        for l in line.lines() {
            let (zone, said) = match l.strip_prefix("zone ").and_then(|r| r.split_once(": ")) {
                Some((zone, said)) => (zone.to_string(), said),
                None if l.contains(" zones not signed") => continue,
                None => (String::new(), l),
            };
            let entry = zones.entry(zone).or_default();
            if said.starts_with("signed") {
                *entry = Some(l.to_string());
            }
        }
        report += &format!("{addr}: {}\n", line.replace('\n', "\n    "));
    }
    // Every replica asks, so all but the first find a signing running and say so: that is
    // not news when the zone was signed, and the whole report is the error when it was not.
    let signed: Option<Vec<String>> = zones.into_values().collect();
    match signed {
        Some(lines) if !lines.is_empty() => Ok(lines.join("\n")),
        _ => bail!("the zone was not signed:\n{report}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_agreeing_take_one_line_and_differing_ones_one_per_replica() {
        let zone = |name: &str, serial: u32, tag: u16| wrapper::metrics::ZoneStatus {
            name: name.into(),
            key_tag: tag,
            serial: Some(serial),
            signed_at: 100,
            ..Default::default()
        };
        let a = Status { zones: vec![zone("r.arpa.", 7, 1), zone("example.test.", 3, 2)], ..Default::default() };
        let b = Status { zones: vec![zone("r.arpa.", 7, 1), zone("example.test.", 4, 2)], ..Default::default() };
        let lines = zone_lines(&[(0, &a), (1, &b)]);
        assert_eq!(lines[1], "zone r.arpa.: serial 7, key tag 1, signed at 1970-01-01T00:01:40Z, next re-signing from -");
        assert_eq!(lines[2], "zone example.test.: the replicas differ");
        assert!(lines[3].starts_with("  replica 0: serial 3") && lines[4].starts_with("  replica 1: serial 4"), "{lines:?}");
        assert!(zone_lines(&[(0, &Status::default())]).is_empty());
    }
    use crate::keygen::Layout;
    use wrapper::config::{Protocol, ReadMode};

    fn params(layout: Layout, zone: &str) -> ClusterParams {
        ClusterParams {
            zones: vec![zone.into()],
            replicas: 4,
            threshold: None,
            bits: 1024,
            algorithm: 8,
            protocol: Protocol::OptTe,
            reads: ReadMode::Ordered,
            corrupt: Vec::new(),
            byzantine: Vec::new(),
            fail_writes_naming: None,
            layout,
            bind_dir: "target/bind9".into(),
            zone_files: Vec::new(),
            resign_after_s: None,
            sign_zone_interval_s: None,
            validity_s: None,
            resign_slice_interval_s: None,
            resign_slice_rrsets: None,
            zone_signer_threads: None,
            signature_cache_entries: None,
            update_auth: exec::auth::Mode::Tsig,
            skip_precheck: Vec::new(),
            rrl_responses_per_second: 0,
            checkpoint_interval: None,
            retained_batches: None,
            peer_routes: None,
            min_request_timeout_ms: None,
            also_notify: Vec::new(),
            catalog_zone: None,
            parent_resolvers: Vec::new(),
            rollover_poll_s: None,
        }
    }

    #[test]
    fn attribution_names_the_accused_and_the_reporters() {
        use wrapper::metrics::PeerFault;
        let fault = |peer, kind: &str, count| PeerFault { peer, kind: kind.into(), count };
        let reports = vec![
            (0, vec![fault(3, "bad_signature_share", 4)], vec![2]),
            (1, vec![fault(3, "bad_signature_share", 2), fault(1, "ignored_self_report", 9)], vec![]),
        ];
        assert_eq!(
            attribution(&reports),
            vec!["replica 2: silent (seen by 0)".to_string(), "replica 3: bad_signature_share x4 (seen by 0), bad_signature_share x2 (seen by 1)".to_string(),]
        );
        assert!(attribution(&[]).is_empty());
    }

    #[test]
    fn printed_commands_keep_the_flags_that_locate_the_cluster() {
        assert_eq!(locating_flags(&params(Layout::default(), "example.test.")), "");
        let custom = Layout { client_port: 20001, metrics_port: 20301, ..Layout::default() };
        assert_eq!(locating_flags(&params(custom, "other.test.")), " --zone other.test. --client-port 20001 --metrics-port 20301");
    }
}
