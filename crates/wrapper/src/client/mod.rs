//! The way back to a client: the reply handles an answer goes to (a UDP socket, a TCP
//! connection's bounded queue, a caller inside the process) without waiting for the client
//! (`reply`), and response rate limiting of UDP answers and of what one client prefix may have
//! ordered (`rrl`, sans-IO). Below every room that answers clients: the front end, the reads
//! and the executor.

pub mod reply;
pub mod rrl;
