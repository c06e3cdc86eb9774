//! A full mesh of mutually authenticated TLS 1.3 links between the replicas of one cluster,
//! carrying several protocols on numbered channels, with the cluster PKI ([`pki`]) that
//! names its replicas.
//!
//! The crate knows nothing of what travels over it: PBFT ordering (bft's `transport` feature
//! runs a replica over a [`MeshSender`]), threshold signing and state transfer (the wrapper)
//! are each a channel. So consensus and transport stay apart: the ordering core is tested
//! without a network, the mesh without a protocol.
//!
//! # Topology
//! Every ordered pair of replicas (i, j) has its own TCP+TLS connection, dialed by i: replica i
//! *sends* to j only on the connection it dialed, and *receives* from j only on the connection j
//! dialed. So each side owns exactly the connections it writes to, there is no tie-break race
//! when both dial at once, and a restarted replica simply dials everybody again. The cost is two
//! connections per pair instead of one, irrelevant for n <= 10.
//!
//! # Authentication
//! The listener requires a client certificate chaining to the cluster CA (rustls
//! `WebPkiClientVerifier`); the dialer verifies the server certificate against the same CA and
//! for the name `replica-<j>.sdns.invalid` of the replica it meant to reach. A received frame is
//! attributed to the replica id bound into the certificate of the connection it arrived on
//! ([`pki::replica_id_from_cert_der`]), never to anything inside the frame.
//! When a peer opens a new connection, its older incoming connection is closed, so a peer holds
//! at most one receiving connection here.
//!
//! Unauthenticated work is bounded: at most `4 * peers + 8` handshakes run at once, each limited
//! by `handshake_timeout`; connections beyond that are closed at once. Someone who can reach the
//! port can therefore delay (not forge) a reconnect by keeping those slots busy.
//!
//! # Framing
//! `u32` big-endian length L, then L bytes: one channel byte and L-1 payload bytes. L-1 must not
//! exceed `max_frame_bytes`; a larger (or empty) frame is a protocol violation that closes the
//! connection. Channels multiplex protocols over the mesh: [`CHANNEL_ORDERING`] (PBFT),
//! [`CHANNEL_SIGNING`] (threshold RSA), [`CHANNEL_STATE`] (state transfer), [`CHANNEL_READS`]
//! (vouched reads); [`CHANNEL_KEEPALIVE`] is reserved.
//!
//! # Receiving
//! A channel is either subscribed ([`Mesh::subscribe`]: a queue per peer, merged for one
//! consumer task) or handled inline ([`Mesh::handle_inline`]: a function called in the task
//! that reads the peer's connection, no queue and no task wake-up in between, for light work
//! that never waits and bounds what it keeps per peer itself).
//!
//! # Loss
//! Each peer has a send queue bounded in frames and in bytes (`queue_frames`, `queue_bytes`), so a
//! peer that stops reading costs at most `queue_bytes` of memory however large the frames are;
//! when a bound would be exceeded the *oldest* frames are dropped and counted (newer protocol
//! messages supersede older ones, and the protocols above retransmit). A
//! subscriber whose queue is full holds up its connection's reader (flow control back to the
//! sender) for up to one second per frame; after that the frame is dropped and counted, so a
//! stuck subscriber cannot stall the other channels forever. A subscriber's queue is one queue per
//! peer, merged round robin into a short queue the consumer reads: a peer that floods a channel
//! fills and waits on its own queue, and the other peers' frames still go through at their
//! share. Each peer's queue is bounded in frames and in bytes (the peers share `queue_frames`
//! and `queue_bytes`, at least 1 MiB each), and a frame being read is allocated as its bytes
//! arrive, so what one peer can make this replica hold per channel is its byte budget, one
//! frame being read and the short merged queue, however fast or slowly it sends. Frames queued while a peer is unreachable are sent once it is
//! back; frames in flight when a connection breaks are lost.
#![forbid(unsafe_code)]

pub mod error;
#[cfg(feature = "links")]
mod links;
pub mod pki;

pub use error::{PeerError, TransportError};
// The links are the crate's main API; without the feature only the PKI and the errors are
// here (what the execution core needs to check a replica's signature, without a runtime).
#[cfg(feature = "links")]
pub use links::*;
