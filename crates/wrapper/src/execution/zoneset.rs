//! The zones a replica serves, by the execution state's zone index (`exec::ExecState::zone_set`):
//! each zone's parts, the update authentication that follows the set, and the hook through
//! which the executor makes the replica serve a changed set (`ZoneHost`, built by `run`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use exec::auth::zones::ZoneAuth;
use exec::{UpdateDecision, UpdateGate, ZoneEntry};
use named_glue::signer::SignatureTimes;
use tokio::sync::watch;

use crate::zone::ZoneMaintenance;

/// The background part of whole-zone signings, shared with the signing socket it uses
/// and with the task that orders `SignZoneFinish`.
pub struct Background {
    /// The times the background signing socket signs with (the running signing's).
    pub times: watch::Sender<Option<SignatureTimes>>,
    /// This replica's part of a signing is done: (the batch it began at, the outcome).
    pub finished: watch::Sender<Option<(u64, Result<(), String>)>>,
}

impl Background {
    pub fn new() -> (Arc<Background>, watch::Receiver<Option<SignatureTimes>>) {
        let (times, times_rx) = watch::channel(None);
        let (finished, _) = watch::channel(None);
        (Arc::new(Background { times, finished }), times_rx)
    }
}

/// One served zone's parts at this replica.
#[derive(Clone)]
pub struct ZoneParts {
    pub maintenance: Arc<ZoneMaintenance>,
    pub background: Arc<Background>,
    /// Its last signing time (agreed), shared with its re-sign timer.
    pub last_signed: Arc<AtomicU64>,
}

/// Every served zone's parts, by zone index.
pub type ZoneMap = BTreeMap<u16, ZoneParts>;

/// A boxed future of the host.
pub type HostFuture<'a> = Pin<Box<dyn Future<Output = Result<ZoneMap, String>> + Send + 'a>>;

/// Makes the replica serve another zone set (built by `run`, which owns what a zone needs:
/// named's configuration, the signing service, the zone's own tasks).
pub trait ZoneHost: Send + Sync {
    /// Prepares serving exactly `zones` (by index), the catalog with serial `catalog_serial`:
    /// named.conf and the catalog written for the set, the added zones' parts made (signing
    /// core, background socket, re-sign timer and finish voter), the removed zones' parts
    /// dropped, the update authentication swapped. named is not restarted here: the caller
    /// restarts it (with a transferred state's zone files, when it installs one). Returns the
    /// parts of every zone now served, those kept taken from `current`.
    fn prepare<'a>(&'a self, zones: &'a BTreeMap<u16, ZoneEntry>, catalog_serial: u32, current: &'a ZoneMap) -> HostFuture<'a>;
}

/// The update authentication of the zones served now: replaced whole at a change of the
/// zone set (by the executor, at one point of the log), read by the execution core and by
/// the client listeners' checks before ordering.
pub struct SharedAuth(RwLock<Arc<ZoneAuth>>);

impl SharedAuth {
    pub fn new(auth: ZoneAuth) -> SharedAuth {
        SharedAuth(RwLock::new(Arc::new(auth)))
    }

    /// The authentication of the zones served now.
    pub fn current(&self) -> Arc<ZoneAuth> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces it (the zone set changed).
    pub fn replace(&self, auth: ZoneAuth) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(auth);
    }
}

impl UpdateGate for SharedAuth {
    fn decide(&self, message: &[u8], agreed_time_s: u64) -> UpdateDecision {
        self.current().decide(message, agreed_time_s)
    }

    fn answer_for_client(&self, request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        self.current().answer_for_client(request, named_answer)
    }

    fn answer_without_named(&self, request: &[u8], rcode: u16, agreed_time_s: u64) -> Vec<u8> {
        self.current().answer_without_named(request, rcode, agreed_time_s)
    }
}

/// The zone the index names among `zones`, when its apex (lower-case wire form) is `apex`.
pub fn zone_by_apex(zones: &ZoneMap, apex: &[u8]) -> Option<u16> {
    zones.iter().find(|(_, p)| exec::auth::wire::name_to_wire(&p.maintenance.zone.to_ascii().to_ascii_lowercase()).as_deref() == Some(apex)).map(|(i, _)| *i)
}
