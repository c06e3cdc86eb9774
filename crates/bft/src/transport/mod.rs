//! Replica-to-replica transport (feature `transport`): a cluster PKI, a mutually authenticated
//! TLS mesh that carries several protocols on numbered channels, and a tokio driver that runs
//! the sans-IO [`crate::Replica`] over it.

pub mod byzantine;
pub mod driver;
pub mod error;
pub mod mesh;
pub mod pki;
pub mod store;

pub use byzantine::{Behaviour, Byzantine};
pub use driver::{spawn_replica, spawn_replica_with, DriverStatus, ReplicaHandle};
pub use error::{PeerError, TransportError};
pub use mesh::{Mesh, MeshConfig, MeshSender, PeerStatus};
pub use store::{Store, StoreError};
