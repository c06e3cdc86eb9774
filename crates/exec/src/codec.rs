//! The framing shared by what replicas send each other outside the ordering core:
//! one version byte, then postcard, with a size limit checked before decoding.

use serde::de::DeserializeOwned;
use serde::Serialize;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    #[error("{what} is {len} bytes, over the {max}-byte limit")]
    TooLarge { what: &'static str, len: usize, max: usize },
    #[error("{what} is empty")]
    Empty { what: &'static str },
    #[error("{what} version {got} is not supported (want {want})")]
    Version { what: &'static str, got: u8, want: u8 },
    #[error("{what} does not decode: {reason}")]
    Decode { what: &'static str, reason: String },
}

pub fn encode<T: Serialize>(version: u8, value: &T) -> Vec<u8> {
    let mut out = vec![version];
    // postcard cannot fail on plain data with an in-memory buffer.
    out.extend(postcard::to_allocvec(value).unwrap_or_default());
    out
}

pub fn decode<T: DeserializeOwned>(what: &'static str, version: u8, max: usize, bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > max {
        return Err(CodecError::TooLarge { what, len: bytes.len(), max });
    }
    let (&got, body) = bytes.split_first().ok_or(CodecError::Empty { what })?;
    if got != version {
        return Err(CodecError::Version { what, got, want: version });
    }
    postcard::from_bytes(body).map_err(|e| CodecError::Decode { what, reason: e.to_string() })
}
