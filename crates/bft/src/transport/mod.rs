//! Running the sans-IO [`crate::Replica`] over the network (feature `transport`): a tokio
//! driver that carries its messages on the mesh's ordering channel (crate `mesh`, which holds
//! the links and the cluster PKI and knows nothing of PBFT), the files behind its persisted
//! state, and the Byzantine rewrites a test cluster's replicas apply to what they send.

pub mod byzantine;
pub mod driver;
pub mod store;

pub use byzantine::{Behaviour, Byzantine};
pub use driver::{spawn_replica, spawn_replica_with, DriverStatus, ReplicaHandle};
pub use store::{Store, StoreError};
