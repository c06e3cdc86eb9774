//! PBFT ordering core for sdns: a sans-IO state machine (Castro and Liskov, "Practical Byzantine
//! Fault Tolerance and Proactive Recovery", TOCS 2002) that orders client requests into batches
//! with an agreed time, among `n >= 3f + 1` replicas of which `f` may be Byzantine.
//!
//! The crate is fully deterministic: no sockets, no tokio, no clock. Time is an argument
//! ([`Time`], microseconds since the Unix epoch, read by the driver from the wall clock), output
//! is polled. A driver loops:
//!
//! ```text
//! let mut replica = Replica::new(config, now)?;
//! loop {
//!     // feed events
//!     replica.submit(now, request)?;                    // a request from a local client
//!     replica.handle_message(now, peer, message);       // `peer` = authenticated channel id
//!     replica.handle_timeout(now);                      // when poll_timeout() is due (spurious calls are fine)
//!     replica.checkpoint(seq, app_digest)?;             // after executing a batch with checkpoint_due
//!     // drain
//!     while let Some(action) = replica.poll_action() { /* Send, Broadcast, Deliver, NeedStateTransfer */ }
//!     let wake_at = replica.poll_timeout();
//! }
//! ```
//!
//! Messages travel as bytes: [`Message::encode`] and [`Message::decode`] (versioned, size limits
//! checked before allocation, never panics on arbitrary input).
//!
//! Inside, a replica's view protocol state is one phase: normal operation in a view (with the
//! new view that installed it) or a view change (with its own view-change message, the last
//! view it ordered in, and the new primary's new view while it is being checked). Data of one
//! phase does not exist in the other, and each transition happens in one place (start a view
//! change; install a new view). Every deadline it keeps (the status and retransmission tick,
//! the request timer, the view-change timer, the primary's next batch) sits in one timer
//! table; [`Replica::poll_timeout`] is the earliest of them. Per-peer rate limits (answers to
//! status reports) are timestamps checked when a message comes, not deadlines: nothing
//! happens when they pass.
//!
//! # Protocol
//! - Normal case: pre-prepare, prepare, commit; batching bounded by count, bytes and delay
//!   (a batch goes at once when nothing is in flight); water marks `(stable, stable + L]`.
//! - Agreed time: the primary stamps each batch; a backup accepts a stamp only within
//!   `max_clock_skew` of its own clock and between the neighbouring batches' stamps. Delivered
//!   times strictly increase (a stamp not above the previous delivered time is raised to it plus
//!   one microsecond, deterministically, which also covers null batches after a view change).
//!   A backup that refuses a pre-prepare for its time only withholds its vote: it keeps the body
//!   (one per seq, like an accepted one) and delivers it on 2f+1 matching commits, so a backup
//!   whose clock is hours off keeps pace with the others (docs/DETERMINISM.md, "Clock skew and
//!   unvoted batches", argues why that is safe).
//! - Requests are deduplicated by `(origin, client, number)`. Only a request's origin sends it
//!   to other replicas, to every replica at once (and again every retransmit interval while it
//!   waits); a `Request` message whose origin is not its sender is refused and blamed.
//! - Origins are authenticated end to end without signatures. A backup accepts (prepares) a
//!   pre-prepare only when every request in it is vouched for: its origin is the primary (the
//!   pre-prepare came from it over the authenticated link), or this replica holds the same
//!   request (key and payload) from its origin directly (or from its own client), or its key
//!   is already delivered (delivering it again is skipped), or f+1 replicas vouch for the whole
//!   batch: the primary by its pre-prepare and f backups by a matching prepare (one of them is
//!   honest and prepared only what it checked). Until then the pre-prepare waits, unreported
//!   (bounded: one per seq in the window), and is checked again when a request or a prepare
//!   arrives and every tick; the request timer runs meanwhile, so a primary that made a
//!   request up is replaced by a view change. A primary proposes another origin's request only
//!   when it holds it from the origin directly and 2f replicas other than itself hold it (the
//!   origin, and backups that said so with a `Holds` message on receiving it: at once when
//!   none went within `batch_delay`, otherwise gathered into one), and fills a
//!   batch only with requests that a common 2f of them hold: f of those are honest and prepare
//!   the batch, and their f prepares vouch for it at every other backup, so a Byzantine origin
//!   that gives a request to the primary alone cannot make an honest primary's batch stall.
//!   Entries installed by a new view are not checked again: each was prepared by a quorum in an
//!   earlier view or is backed by f+1 accepted pre-prepares (the decision's `a2`), so an honest
//!   replica vouched for it. Batches taken in catch-up (f+1 identical copies, or a chain that
//!   reproduces a certified checkpoint's log digest) were committed by honest replicas, which
//!   prepared them only vouched for, so they are authenticated too.
//! - A backup suspects
//!   the primary when a request it knows is not ordered in time: at least `min_request_timeout`,
//!   doubled per view change without progress, at least four times the ordering latency it
//!   observed recently, at most `request_timeout` (see [`Config::min_request_timeout`]); when
//!   its timer fires it first sends its own young requests to everyone, so the others start
//!   theirs.
//! - Byzantine peers are bounded in what they can make a replica hold or send: another
//!   origin's pending requests within `max_pending_bytes_per_origin`, a request within
//!   `max_request_bytes`, every proposal within the batch limits, client records an equal share
//!   of `max_clients` per origin, answers to status reports once per half retransmit interval
//!   per peer and at most `PUSH_BURST` batches / four batch sizes each. A primary shares each
//!   batch's bytes and count equally among the origins queued at its head, so one origin's
//!   large requests cannot crowd out the others'. [`Replica::held_bytes`]
//!   accounts what is held and [`Replica::held_bytes_bound`] states its bound, which the
//!   simulator checks under a flooder.
//! - Per-origin budget of the log (with `max_origin_bytes_per_sec` > 0, the default): a token
//!   bucket per origin of `batch_max_bytes`, refilled at that rate by the agreed times of the
//!   batches in sequence order and charged, for every request in a batch, its wire size but at
//!   least `min_request_charge` (so tiny requests cannot go by the thousand); a request may be
//!   taken while its origin's balance is positive ([`OriginBudgets`], a function of the log:
//!   the same at every honest replica after the same batch, certified with the deduplication
//!   table in each checkpoint's state digest and carried by [`DeliveryBase`] for state
//!   transfer). An honest primary proposes by it, from the budget after its own last proposal
//!   refilled to the new batch's time (requests of an origin over it wait, parked, until half
//!   a bucket is back). A backup checks a pre-prepare for seq s against the budget after its
//!   delivered batches and then each later batch below s that it holds committed or accepted
//!   in the current view; it refuses one that breaks the rule, blames the primary (`batch
//!   over the origin budget`) and runs its request timer, so a view change replaces it. The
//!   rule is monotone: a batch left out never makes the state stricter, and a backup knows a
//!   subset of the batches the primary proposed before s, so it is never stricter than an
//!   honest primary (which proposes nothing while it does not know every batch before its
//!   next seq). Pipelining, reordering and view changes cost only leniency: a backup that has
//!   not seen s - 1 yet checks s more leniently, and entries a new view re-proposes are not
//!   checked again (a quorum prepared them). So a primary cannot fill batches with its own (or
//!   one origin's) requests beyond the budget while including the others', and one origin
//!   cannot make the cluster order, log and persist at full speed however idle the others are.
//! - View change in the MAC variant of the paper: the transport authenticates senders but
//!   messages carry no signatures, so a view change is trusted only for its own sender's claims
//!   (P and Q sets, checkpoint claims) and a new-view names the view changes it used by digest;
//!   backups recompute the decision from view changes they received directly. A replica joins
//!   the smallest view that f+1 others ask for beyond its own. One whose view change gathers no
//!   quorum (alone, say, after its first requests took longer than its timeout over slow links)
//!   goes back, after a view-change timeout, to its last view once f+1 peers report ordering
//!   there: withdrawn, it votes for nothing in that view (its view change stays true and counts
//!   if the others move later; it sends that same one again then) and delivers on 2f+1 commits,
//!   its clients' requests among them. The new primary
//!   searches the view changes it holds for a subset (a quorum at least) that decides, so one
//!   Byzantine view change that makes every set containing it undecidable is left out. A replica that
//!   missed a new-view accepts it once f+1 replicas relay the same one. Timeouts double per
//!   failed view.
//! - Checkpoints every K with a quorum of matching `(seq, time, log digest, state digest)`. The
//!   state digest covers the application's digest and the request deduplication table at `seq`
//!   ([`checkpoint_state_digest`]; the table rides on the checkpoint's [`Batch::base`]), as
//!   PBFT's checkpointed state includes its reply table. The log below the stable checkpoint is collected, `retained_batches` committed batches are kept
//!   below it to serve laggards. The log digest is a hash chain over every committed
//!   `(seq, proposal digest)`.
//! - Catch-up: replicas broadcast a status report every `retransmit_interval`; peers push the
//!   committed batches a laggard misses. The laggard accepts a batch once f+1 distinct peers sent
//!   the same one, or a run of batches from a single peer that, chained onto its log, reproduces
//!   the log digest of a certified checkpoint. (Messages are unsigned, so a commit certificate
//!   relayed by one peer could be forged; these two rules replace it.) When the batches are gone
//!   on f+1 replicas the core emits [`Action::NeedStateTransfer`]: fetching application state is
//!   the application's business (its snapshot carries the checkpoint's delivery base); it then
//!   calls [`Replica::state_transferred`] with that checkpoint, its own digest and the base,
//!   the core checks them against the certified state digest and installs the table, and
//!   delivery resumes after it.
//!
//! - Attribution: every violation a replica can prove is blamed on its sender and counted per
//!   peer and reason ([`Status::faults`]). Besides malformed or conflicting messages, a primary
//!   is blamed for equivocating when f+1 backups prepared, in one view, another digest than the
//!   pre-prepare this replica accepted from it (one of them is honest and prepared only what
//!   the primary sent it); a view change that reports a batch beyond one window above the
//!   highest checkpoint it names (an honest one never does: it reports up to its high water
//!   mark and names its view anchor) is refused and blamed; a status report that no honest
//!   replica can send (changing views in view 0, a stable checkpoint off the interval) is
//!   ignored and blamed. Each of these is a property of one message, so reordering, loss or
//!   duplication by the network never makes an honest replica look guilty.
//!
//! # Transport (feature `transport`, off by default)
//! [`transport`] runs a [`Replica`] over the network, kept out of the core: the tokio driver
//! (`transport::driver`) carries its messages on the ordering channel of the replicas' TLS mesh
//! (crate `mesh`, which holds the links and the cluster PKI and knows nothing of PBFT), and
//! writes what it persists through `transport::store`. `transport::byzantine` carries the
//! simulator's Byzantine actors over to real processes: the driver passes a Byzantine replica's
//! outgoing messages through one (test clusters only; honest drivers have none).
//!
//! # Known limits (not defended by this crate, each with why it is tolerable or who defends it)
//! - A replica that loses its state (a restart without its log) forgets what it prepared and
//!   promised; PBFT's proactive recovery, which makes that safe, is not implemented. Count such
//!   a replica against `f` until it has caught up. A restart that keeps the `Replica` is safe.
//!   Safety and liveness hold as long as such replicas plus Byzantine ones are at most `f`.
//! - Origins are authenticated without signatures (see "Protocol"), at a price: a Byzantine
//!   origin that gives a request to the primary and to fewer than f honest backups, together
//!   with f - 1 other Byzantine replicas that claim to hold it, can make an honest primary
//!   propose a batch that does not become vouched (for n = 4, f = 1, it needs no accomplice:
//!   the primary waits for the origin plus one backup, and the backup is honest, so it cannot
//!   happen there); the batch waits until a view change, the same class as the limit below.
//!   A request from a backup origin takes two more message delays than one from the
//!   primary (its request to everyone, then the others' `Holds`), where it took one before.
//!   A replica that lost its state forgets the requests it held, and cannot vouch for them
//!   until their origin retransmits them (every interval) or f backups prepare. A claim that
//!   overtakes its request (the origin sends to everyone at once) is kept until the request
//!   comes, at most 4096 per claimer (a Byzantine claimer pushes out only its own); dropping it
//!   instead left such requests waiting for the claimer's repeat an interval later, long enough
//!   for backups to suspect the primary when one replica was down (tests/statexfer.rs).
//! - A Byzantine origin can number its own clients' requests as it likes (within
//!   `max_number_jump`, now the pending bound rather than 2^32); that only affects its own.
//! - A Byzantine origin can send its requests to the backups but not to the primary; the
//!   backups cannot tell this from a primary that censors that origin, so they time out and
//!   change views, and the next primary (which holds them) orders them. This costs at most one
//!   view change per adaptive request timeout (from `min_request_timeout` up, since the
//!   ordering in between is progress) and never stops delivery: every view with an honest
//!   primary orders everything pending at it. (With signed requests a backup could hand the
//!   request to the primary and remove the doubt. A per-origin timer with growing patience
//!   for origins whose requests alone cause suspicion was tried and reverted: it broke
//!   liveness in simulator seeds without any Byzantine replica, n = 10 seeds 80 and 162.)
//! - A Byzantine replica that sends different view changes to different replicas (without
//!   sending each version to everyone, as twins do) can stall a view that uses one of them;
//!   backups then time out and move to the next view. Two versions per sender are kept.
//! - A new view is still not decided from a *set* in which a view change reports a prepared
//!   entry beyond the chosen checkpoint's window (deciding could drop a committed batch: a
//!   single honest holder of a later checkpoint may be the only one in the set, so "f+1 holders
//!   back it" cannot be required without risking safety). Made-up far-ahead entries no longer
//!   stall view changes: entries beyond the window of the sender's own highest checkpoint are
//!   refused and blamed, and a poisoner that also makes up the checkpoints to back them (well
//!   formed, so not provably false) is left out by the new primary's search (see above): once
//!   it holds the view changes of all honest replicas (retransmitted every interval) the honest
//!   subset is among those tried, so a view with an honest primary installs. The search tries
//!   at most `MAX_SEARCH` (1024) subsets, every subset for n <= 13; above that a poisoner is
//!   left out only if it claims the highest seqs (its far-ahead entries make it so). Such a
//!   well-formed poisoner is not blamed: nothing it sent is false on its face.
//! - A replica that sends well-formed status reports far too often is not blamed: nothing in
//!   one report is false, and the network may bunch or duplicate an honest replica's reports.
//!   What it can make a replica send is bounded instead: one answer per half retransmit
//!   interval, at most `PUSH_BURST` batches and four batch sizes of bytes.
//! - View-change timeouts double per failed view up to 32 times the configured value.
//! - The per-origin budget bounds an origin's average rate, not its share of a moment: a
//!   Byzantine primary may still put a full bucket (`batch_max_bytes`) of its own requests in
//!   at once, and one more batch per backup that has not seen the batches before it. An
//!   honest origin that wants more than its budget waits at the primary (the defaults leave
//!   far more than DNS clients send through one replica). A new primary behind its view's
//!   starting checkpoint proposes nothing until it has caught up (it could not check its own
//!   proposals as strictly as its backups).
//!
//! # Testing
//! - `tests/sim/`: a deterministic simulator (virtual time, seeded ChaCha RNG, per-link delays,
//!   loss, duplication, reordering, partitions that heal, crashes with and without state loss,
//!   honest clients, and Byzantine actors: equivocating primary, silent primary, conflicter,
//!   impersonator, replayer, twins, view-change poisoner, forged relays, peer flooder, status
//!   spammer, a budget hog (a primary that fills every batch with its own requests up to the
//!   batch limits; the log must carry no more of its bytes than its budget over the log's
//!   span, a bucket and a window of slack), and a hostile primary whose batches are drawn per seed from a grammar of hostile
//!   batches: requests under other origins at every numbering bound, duplicate and conflicting
//!   keys, batches at and just over the count and byte limits, times at and just beyond the
//!   skew, equivocation). Each seed runs a safety phase with faults, then a liveness phase after
//!   stabilisation; it checks agreement per seq, delivery of every request submitted to an
//!   honest replica, no duplicate delivery, strictly increasing agreed times, no delivered
//!   number jump, that no request is delivered under an honest origin which that origin's
//!   clients did not submit (same key and bytes), a bounded run of views without delivery after stabilisation, that no honest
//!   replica is ever blamed (and that forgers and impersonators are), that an honest replica's
//!   accounted bytes stay within [`Replica::held_bytes_bound`] under a flooder, that a status
//!   spammer gets bounded pushes, and (for a few seeds) that a seed replays to the same
//!   event-trace hash. `cargo test -p bft` runs 1500 seeds for n = 4, 500 for n = 7 and 250
//!   for n = 10 with behaviours drawn at random (`SIM_SEEDS=N` overrides the count, the workspace's seed convention in crates/testkit),
//!   and for each of the eleven named actors (`actor_*`, one per behaviour, checked by
//!   `every_actor_has_a_test`) 100 seeds for n = 4 and 33 for n = 7 with f replicas behaving
//!   that way (`SIM_SEEDS=N` for n = 4): 3713 seeds per run, all with liveness checked.
//! - `tests/sim/scenarios.rs`: scripted runs of faults found outside the simulator, seeded and
//!   bounded in simulated time: a backup restarted two hours ahead under a load three times the
//!   push rate catches up within 4 s; a replica whose links outran its request timeout at
//!   start-up and changed views alone is back ordering with the others and serving its clients
//!   (`cargo test -p bft --test sim -- scenarios`).
//! - Campaign of the generated adversary: `SIM_SEEDS=100000 cargo test --release -p bft --test sim -- actor_hostile_primary`
//!   (n = 4, and a third of the count for n = 7).
//! - The budget hog: `cargo test -p bft --test sim -- actor_budget_hog` (100 seeds at n = 4, 33
//!   at n = 7); `SIM_SEEDS=N` for a campaign. A batch over the budget refused and blamed,
//!   an honest primary's batch at the budget's edge accepted: `tests/origins.rs`.
//! - `tests/origins.rs`: a primary forging requests under other origins (numbers 2^32 - 1
//!   above, at the jump, just above, below, a delivered key with other bytes) gets none of
//!   them delivered and is replaced; a request given to the primary alone stalls no batch.
//! - Replay one seed: the line a failure prints, `SIM_SEED=<seed> cargo test -p bft --test sim -- <test> --exact --nocapture`
//!   (`BFT_DEBUG=1` prints deliveries, faults, view changes).
//! - Soak: `SIM_SEEDS=100000 cargo test --release -p bft --test sim -- soak --ignored --nocapture`.
//! - Fuzzing the decoder: `cd crates/bft/fuzz && cargo +nightly fuzz run decode`.
//! - Benchmark: `cargo bench -p bft --bench order` (figures in docs/BENCHMARKS.md).

// `%` keeps the code building on the workspace's declared rust-version (is_multiple_of is 1.87).
#![allow(clippy::manual_is_multiple_of)]
#![forbid(unsafe_code)]

pub mod actors;
mod budget;
mod codec;
mod decide;
mod message;
mod persist;
mod replica;
mod types;

pub use codec::{new_view_digest, request_digest, view_change_digest, DecodeError, WIRE_VERSION};
pub use message::{CheckpointClaim, Message, NewView, PrePreparedEntry, PreparedEntry, StatusReport, ViewChange};
pub use persist::{checkpoint_state_digest, Persist, PersistedState, RestoreError, TransferMismatch, Transferred};
pub use replica::{Action, Replica, Status, Suspicion};
pub use types::{
    Batch, CheckpointError, ClientEntry, Config, ConfigError, DeliveryBase, Digest, Limits, OriginBudgets, Proposal, ReplicaId, Request, RequestKey,
    StateTransferError, SubmitError, Time, DEDUP_WINDOW, REQUEST_OVERHEAD,
};

#[cfg(feature = "transport")]
pub mod transport;
