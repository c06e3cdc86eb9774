//! The ordering (`bft`), resumed where it left off, and the execution state it must agree
//! with after any restart.

use std::path::Path;

use anyhow::{Context, Result};
use bft::transport::driver::{now, spawn_replica_with, ReplicaHandle};
use bft::transport::Store;
use bft::{Batch, Replica};
use bytes::Bytes;
use mesh::MeshSender;
use tokio::sync::mpsc;
use tracing::info;

use crate::config::Settings;
use crate::faults::byzantine::Mode;
use exec::ExecState;

/// The execution state persisted in the state directory (`exec.state`).
pub(super) fn load_exec_state(state_dir: &Path) -> Result<ExecState> {
    let state_file = state_dir.join("exec.state");
    let mut exec_state = ExecState::load(&state_file).context("the execution state")?;
    if !state_file.exists() {
        // A state directory from before the execution core kept two plain numbers.
        let number = |name: &str| std::fs::read_to_string(state_dir.join(name)).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        exec_state.executed = number("executed.seq");
        let last_signed_s = number("last-signed");
        if last_signed_s != 0 {
            exec_state.zone_mut(0).last_signed_s = last_signed_s;
        }
    }
    Ok(exec_state)
}

/// Starts the ordering driver. The ordering resumes where it left off (view, promises,
/// committed batches), so that it and the executor (at `executed`) agree on where they are
/// after any restart.
pub(super) fn start_ordering(
    s: &Settings,
    executed: u64,
    mesh: MeshSender,
    incoming: mpsc::Receiver<(u16, Bytes)>,
) -> Result<(ReplicaHandle, mpsc::UnboundedReceiver<Batch>)> {
    let config = bft::Config::from(s);
    let id = s.id;
    let store = Store::open(&s.state_dir.join("ordering")).context("the ordering state directory")?;
    let replica = match store.load().context("the ordering state")? {
        Some(persisted) => {
            let deliverable = persisted.deliverable();
            info!(
                replica = id,
                view = persisted.view(),
                stable = persisted.stable_checkpoint().seq,
                deliverable,
                executed,
                "resuming the ordering from its persisted state"
            );
            if deliverable < executed {
                // The ordering state is older than what named applied: a crash between a state
                // transfer's install and the ordering's record of it, or a copied directory.
                // The executor skips every batch up to its executed position (named holds
                // them), so the ordering may catch up from its peers, or by a state transfer
                // once they no longer hold those batches; nothing is applied twice.
                tracing::warn!(replica = id, deliverable, executed, "the ordering state is behind the executed position; catching up from peers");
            }
            Replica::restore(config, now(), persisted).context("restoring the ordering state")?
        }
        None => {
            if executed > 0 {
                tracing::error!(replica = id, executed, "no ordering state next to an executed position (a state directory from an older version): this replica counts as faulty until it has caught up");
            }
            Replica::new(config, now()).context("ordering configuration")?
        }
    };
    let behaviour = s.test.byzantine.and_then(Mode::ordering).map(|b| bft::transport::Byzantine::new(b, replica.config()));
    // Vouched reads travel on the mesh's reads channel (`crate::reads::vouched`), never through the
    // ordering driver, which only publishes the read barrier they wait for.
    Ok(spawn_replica_with(replica, mesh, incoming, behaviour, Some(store)))
}
