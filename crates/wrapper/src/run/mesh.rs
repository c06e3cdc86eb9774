//! The mesh to the other replicas (mutual TLS under the cluster CA), and the identities
//! sign-zone requests are signed and checked with, which are the mesh's.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use mesh::{Mesh, MeshConfig, CHANNEL_ORDERING, CHANNEL_SIGNING, CHANNEL_STATE};
use tokio::sync::mpsc;

use super::keys::read;
use crate::config::Settings;
use crate::ops::files::read_secret;
use exec::{SignZoneSigner, SignZoneVerifier};

type Inbox = mpsc::Receiver<(u16, Bytes)>;

/// The running mesh with its channels taken, and this replica's sign-zone identities.
pub(super) struct MeshParts {
    pub mesh: Mesh,
    pub ordering: Inbox,
    pub signing: Inbox,
    pub state: Inbox,
    /// Check which replica signed a sign-zone request: one per zone, in zone index order.
    pub sign_zone_verifiers: Vec<SignZoneVerifier>,
    /// Sign this replica's sign-zone requests and finish claims: one per zone.
    pub sign_zone_signers: Vec<Arc<SignZoneSigner>>,
}

/// The mesh's own settings: ordering on channel 0, signing on channel 1, state transfer
/// and reads on theirs.
fn mesh_config(s: &Settings, ca_pem: String, cert_pem: String, tls_key_pem: String) -> MeshConfig {
    let peers: Vec<(u16, SocketAddr)> = s.peers.iter().filter(|p| p.id != s.id).map(|p| (p.id, p.peer)).collect();
    let mut config = MeshConfig::new(s.id, s.me.peer, peers, ca_pem, cert_pem, tls_key_pem);
    // Every ordering message the core may send must fit a frame: a view change reports up to
    // a window of prepared batches (tens of MiB when peers fill batches, as a flooder does),
    // and one that cannot be sent stalls the view change.
    let max_message = bft::Config::new(s.replicas, s.id).max_message_bytes;
    config.max_frame_bytes = config.max_frame_bytes.max(max_message).min(mesh::MAX_FRAME_BYTES_LIMIT);
    config.queue_bytes = config.queue_bytes.max(config.max_frame_bytes);
    config
}

pub(super) async fn start_mesh(s: &Settings) -> Result<MeshParts> {
    let tls_key_pem = read_secret(&s.tls_key).map_err(|e| anyhow!(e)).context("replica.tls_key")?;
    let (ca_pem, cert_pem) = (read(&s.ca_cert)?, read(&s.cert)?);
    // Sign-zone requests are signed with the mesh identity over the zone's name and checked
    // against the CA: one verifier and one signer per zone, in zone index order.
    let ca_der = mesh::pki::cert_der_from_pem(&ca_pem).context("cluster.ca_cert")?;
    let sign_zone_verifiers = s.zones.iter().map(|z| SignZoneVerifier::new(&z.name, ca_der.clone())).collect();
    let sign_zone_signers = s
        .zones
        .iter()
        .map(|z| SignZoneSigner::new(s.id, &z.name, &cert_pem, tls_key_pem.clone()).map(Arc::new).map_err(anyhow::Error::msg).context("replica.cert"))
        .collect::<Result<Vec<_>>>()?;
    let mesh = Mesh::start(mesh_config(s, ca_pem, cert_pem, tls_key_pem)).await.context("starting the replica mesh")?;
    let signing = mesh.subscribe(CHANNEL_SIGNING).context("mesh signing channel")?;
    let ordering = mesh.subscribe(CHANNEL_ORDERING).context("mesh ordering channel")?;
    let state = mesh.subscribe(CHANNEL_STATE).context("mesh state-transfer channel")?;
    Ok(MeshParts { mesh, ordering, signing, state, sign_zone_verifiers, sign_zone_signers })
}
