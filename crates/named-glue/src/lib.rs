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
//! - [`keys`]: the zone's DNSKEY from an RSA public key ([`keys::ZoneKey`]),
//!   key tag, and the `.key` / External `.private` files named loads.
//! - [`signzone`]: initial signing of an unsigned zone through the socket
//!   with the patched dnssec-signzone ([`signzone::sign_zone_file`]).
//! - [`supervisor`]: named as a supervised child ([`supervisor::Supervisor`]).
//! - [`forward`]: forwarding a DNS message to named over UDP/TCP and zone
//!   transfers as message streams ([`forward::Forwarder`]).
//! - [`tools`]: where the build's binaries are ([`tools::BindTools`]).
//!
//! Determinism: every replica's named must sign the same bytes. The agreed
//! time T of the ordered request being executed gives inception T - 3600
//! and expiration T + validity ([`signer::SignatureTimes::from_agreed`]);
//! the service writes both into the to-be-signed data before signing and
//! named stores exactly those values.

pub mod conf;
pub mod forward;
pub mod keys;
pub mod signer;
pub mod signzone;
pub mod supervisor;
pub mod time;
pub mod tools;
pub mod wire;

/// Environment variable telling the patched named / dnssec-signzone where
/// the signing socket is; when set, External keys sign remotely.
pub const SIGNER_SOCKET_ENV: &str = "SDNS_SIGNER_SOCKET";
/// Environment variable with named's wait for a reply, in milliseconds.
pub const SIGNER_TIMEOUT_ENV: &str = "SDNS_SIGNER_TIMEOUT_MS";
