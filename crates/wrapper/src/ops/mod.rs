//! Operations: what the replica tells its operator and how it keeps itself running. The
//! metrics and status (`metrics`, served by `front::endpoint`), whether the replica makes
//! progress (`health`), the essential tasks the replica stops on (`tasks`), and the dealer's
//! files as a replica reads them (`files`).

pub mod files;
pub mod health;
pub mod metrics;
pub mod tasks;
