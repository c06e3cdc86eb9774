//! bft (work in progress).
