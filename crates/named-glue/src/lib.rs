//! named-glue: everything that touches the patched BIND named.
//!
//! The patched named (patches/bind9) does all DNS work but no longer holds
//! the zone's private key: when it must sign, `dns_dnssec_sign` sends the
//! RFC 4034 to-be-signed bytes over a unix datagram socket (named by the
//! environment variable [`SIGNER_SOCKET_ENV`]) and builds the RRSIG from the
//! reply. This crate is the other end of that socket and the rest of the
//! glue around named:
//!
//! - [`wire`]: the signing-socket format ([`wire::Request`], [`wire::Reply`]),
//!   specified in the module docs, with test vectors in `testdata/`.
//! - [`signer`]: the [`signer::Signer`] trait the wrapper implements (async,
//!   boxed future) and [`signer::SigningService`], which receives named's
//!   requests, rewrites the signature times to the agreed ones
//!   ([`signer::TimeSource`]), asks the signer and replies.
//! - [`conf`]: named.conf for one replica ([`conf::NamedConf`]) with the
//!   determinism settings, TSIG keys ([`conf::TsigKey`]), `named-checkconf`.
//! - [`keys`]: the zone's DNSKEY from an RSA, ECDSA P-256 or Ed25519 public key
//!   ([`keys::ZoneKey`]), key tag, DS, and the `.key` / External `.private` files named loads.
//! - [`signzone`]: initial signing of an unsigned zone through the socket
//!   with the patched dnssec-signzone ([`signzone::sign_zone_file`]).
//! - [`supervisor`]: named as a supervised child ([`supervisor::Supervisor`]).
//! - [`signal`]: signals to processes by pid (kill(2)), the crate's one `unsafe` call
//!   besides the child set-up in `supervisor` (`PR_SET_PDEATHSIG`) and [`limits`]
//!   (getrlimit/setrlimit: the replica's open-file limit raised to the hard one).
//! - [`forward`]: forwarding a DNS message to named over UDP/TCP and zone
//!   transfers as message streams ([`forward::Forwarder`]).
//! - [`rrwire`]: DNS messages walked as wire bytes (transfers, digests,
//!   the classifier), independent of what a full decoder accepts.
//! - [`tools`]: where the build's binaries are ([`tools::BindTools`]).
//!
//! Determinism: every replica's named must sign the same bytes. The agreed
//! time T of the ordered request being executed gives inception T - 3600
//! and expiration T + validity ([`signer::SignatureTimes::from_agreed`]);
//! the service writes both into the to-be-signed data before signing and
//! named stores exactly those values.

//!
//! Facts measured against the real named 9.18.49 (see tests/named.rs):
//! - One key with flags 257 signs everything (dnssec-signzone needs `-z`,
//!   dnssec-verify needs `-z` to accept a zone without a separate ZSK).
//! - named stores whatever signature of the right length the signer
//!   returns: the signer must check its result (shoup-rsa's combine and
//!   verify do) before replying.
//! - AXFR order of the RRsets at one name follows named's insertion
//!   history: after a restart replays the journal it can differ. Compare
//!   zones of replicas with different histories as sorted record sets.
//! - Between updates named signs nothing (no timers with
//!   `dnssec-update-mode no-resign`), also not after a restart.
//! - named accepts `deny <key> zonesub DNSKEY CDS CDNSKEY NSEC3PARAM
//!   TYPE65534;` and answers REFUSED to such updates.
//! - External ECDSA P-256 (13) and Ed25519 (15) keys sign through the socket
//!   like RSA ones, with 64-byte signatures (r || s; RFC 8032); named and
//!   dnssec-signzone refuse any other length (tests/ec.rs).

pub mod conf;
pub mod forward;
pub mod keys;
pub mod limits;
pub use dnswire::rrwire;
pub mod signal;
pub mod signer;
pub mod signzone;
pub mod supervisor;
pub mod time;
pub mod tools;
pub mod wire;

/// Environment variable telling the patched named / dnssec-signzone where
/// the signing socket is; when set, External keys sign remotely.
pub const SIGNER_SOCKET_ENV: &str = "SDNS_SIGNER_SOCKET";
/// Environment variable with the interval (ms) at which named re-sends a signing request
/// still unanswered (default 2000). named has no deadline: it waits until the reply comes.
pub const SIGNER_RESEND_ENV: &str = "SDNS_SIGNER_RESEND_MS";
