//! Fault injection for tests and demonstrations, off unless switched on: the Byzantine modes a
//! test cluster's configuration names (`byzantine`), and the seeded bugs the history checker
//! must catch (`seeded_bug`, from the environment only).

pub mod byzantine;
pub mod seeded_bug;
