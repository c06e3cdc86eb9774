//! The front end: what clients and the operator talk to. `listener` takes DNS over UDP and TCP
//! on the public address and sends each request the way `reads::route` decides; `gateway`
//! numbers what is to be ordered and submits it; `endpoint` serves the metrics, `/status` and
//! the admin requests over loopback HTTP.

pub mod endpoint;
pub mod gateway;
pub mod listener;
