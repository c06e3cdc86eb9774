//! Versioned compact binary codec, written by hand so that every length is checked against the
//! bytes actually present and the configured limits before anything is allocated.
//!
//! Layout: a version byte ([`WIRE_VERSION`]), a tag byte, then the fields in declaration order.
//! Integers are LEB128 varints, digests 32 raw bytes, sequences a varint count then elements.
//! Trailing bytes are an error, so each message has exactly one encoding.

use crate::message::{CheckpointClaim, Message, NewView, PrePreparedEntry, PreparedEntry, StatusReport, ViewChange};
use crate::types::{Digest, Limits, Proposal, ReplicaId, Request, RequestKey, Time};

/// Version byte that starts every encoded message.
pub const WIRE_VERSION: u8 = 1;

const TAG_REQUEST: u8 = 1;
const TAG_PRE_PREPARE: u8 = 2;
const TAG_PREPARE: u8 = 3;
const TAG_COMMIT: u8 = 4;
const TAG_CHECKPOINT: u8 = 5;
const TAG_VIEW_CHANGE: u8 = 6;
const TAG_NEW_VIEW: u8 = 7;
const TAG_STATUS: u8 = 8;
const TAG_COMMITTED: u8 = 9;
// 10 and 11 were the read probes and vouches of an earlier version: never reused.
const TAG_HOLDS: u8 = 12;

/// Why bytes are not a valid message (the peer's fault).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("message of {size} bytes exceeds the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("unsupported wire version {0}")]
    Version(u8),
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("truncated while reading {0}")]
    Truncated(&'static str),
    #[error("malformed varint in {0}")]
    Varint(&'static str),
    #[error("{field} value {value} out of range")]
    OutOfRange { field: &'static str, value: u64 },
    #[error("{field} has {count} entries, more than allowed")]
    TooMany { field: &'static str, count: u64 },
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

impl Message {
    /// Encodes the message (version byte first).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(WIRE_VERSION);
        match self {
            Message::Request { sender, request } => {
                out.push(TAG_REQUEST);
                put_u64(&mut out, u64::from(*sender));
                write_request(&mut out, request);
            }
            Message::Holds { sender, requests } => {
                out.push(TAG_HOLDS);
                put_u64(&mut out, u64::from(*sender));
                put_len(&mut out, requests.len());
                for (key, digest) in requests {
                    put_u64(&mut out, u64::from(key.origin));
                    put_u64(&mut out, key.client);
                    put_u64(&mut out, key.number);
                    out.extend_from_slice(digest);
                }
            }
            Message::PrePrepare { sender, view, seq, proposal } => {
                out.push(TAG_PRE_PREPARE);
                put_u64(&mut out, u64::from(*sender));
                put_u64(&mut out, *view);
                put_u64(&mut out, *seq);
                write_proposal(&mut out, proposal);
            }
            Message::Prepare { sender, view, seq, digest } | Message::Commit { sender, view, seq, digest } => {
                out.push(if matches!(self, Message::Prepare { .. }) { TAG_PREPARE } else { TAG_COMMIT });
                put_u64(&mut out, u64::from(*sender));
                put_u64(&mut out, *view);
                put_u64(&mut out, *seq);
                out.extend_from_slice(digest);
            }
            Message::Checkpoint { sender, checkpoint } => {
                out.push(TAG_CHECKPOINT);
                put_u64(&mut out, u64::from(*sender));
                write_checkpoint(&mut out, checkpoint);
            }
            Message::ViewChange(view_change) => {
                out.push(TAG_VIEW_CHANGE);
                write_view_change(&mut out, view_change);
            }
            Message::NewView { sender, new_view } => {
                out.push(TAG_NEW_VIEW);
                put_u64(&mut out, u64::from(*sender));
                write_new_view(&mut out, new_view);
            }
            Message::Status(status) => {
                out.push(TAG_STATUS);
                put_u64(&mut out, u64::from(status.sender));
                put_u64(&mut out, status.view);
                out.push(u8::from(status.view_changing));
                put_u64(&mut out, status.last_delivered);
                put_u64(&mut out, status.stable_seq);
                put_u64(&mut out, status.oldest_retained);
            }
            Message::Committed { sender, seq, proposal } => {
                out.push(TAG_COMMITTED);
                put_u64(&mut out, u64::from(*sender));
                put_u64(&mut out, *seq);
                write_proposal(&mut out, proposal);
            }
        }
        out
    }

    /// Decodes one message. Never panics; refuses oversized input before allocating.
    pub fn decode(bytes: &[u8], limits: Limits) -> Result<Message, DecodeError> {
        if bytes.len() > limits.max_message_bytes {
            return Err(DecodeError::TooLarge { size: bytes.len(), limit: limits.max_message_bytes });
        }
        let mut reader = Reader { bytes, position: 0, limits };
        let version = reader.byte("version")?;
        if version != WIRE_VERSION {
            return Err(DecodeError::Version(version));
        }
        let tag = reader.byte("tag")?;
        let message = match tag {
            TAG_REQUEST => Message::Request { sender: reader.replica()?, request: reader.request()? },
            TAG_HOLDS => {
                let sender = reader.replica()?;
                // An entry is at least 35 bytes (three varints and a digest).
                let count = reader.count("holds", 35, reader.limits.max_entries)?;
                let mut requests = Vec::with_capacity(count);
                for _ in 0..count {
                    let key = RequestKey { origin: reader.replica()?, client: reader.u64("client")?, number: reader.u64("number")? };
                    requests.push((key, reader.digest()?));
                }
                Message::Holds { sender, requests }
            }
            TAG_PRE_PREPARE => {
                Message::PrePrepare { sender: reader.replica()?, view: reader.u64("view")?, seq: reader.u64("seq")?, proposal: reader.proposal()? }
            }
            TAG_PREPARE => Message::Prepare { sender: reader.replica()?, view: reader.u64("view")?, seq: reader.u64("seq")?, digest: reader.digest()? },
            TAG_COMMIT => Message::Commit { sender: reader.replica()?, view: reader.u64("view")?, seq: reader.u64("seq")?, digest: reader.digest()? },
            TAG_CHECKPOINT => Message::Checkpoint { sender: reader.replica()?, checkpoint: reader.checkpoint()? },
            TAG_VIEW_CHANGE => Message::ViewChange(reader.view_change()?),
            TAG_NEW_VIEW => Message::NewView { sender: reader.replica()?, new_view: reader.new_view()? },
            TAG_STATUS => Message::Status(StatusReport {
                sender: reader.replica()?,
                view: reader.u64("view")?,
                view_changing: reader.bool("view_changing")?,
                last_delivered: reader.u64("last_delivered")?,
                stable_seq: reader.u64("stable_seq")?,
                oldest_retained: reader.u64("oldest_retained")?,
            }),
            TAG_COMMITTED => Message::Committed { sender: reader.replica()?, seq: reader.u64("seq")?, proposal: reader.proposal()? },
            other => return Err(DecodeError::UnknownTag(other)),
        };
        let remaining = reader.remaining();
        if remaining != 0 {
            return Err(DecodeError::Trailing(remaining));
        }
        Ok(message)
    }
}

/// Digest of a request's payload, by which [`Message::Holds`] names what its sender holds.
pub fn request_digest(request: &Request) -> Digest {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"sdns-bft-request-v1");
    hasher.update(&request.payload);
    hasher.finalize().into()
}

/// Digest of a view-change message (the new-view message names view changes by it).
pub fn view_change_digest(view_change: &ViewChange) -> Digest {
    use sha2::{Digest as _, Sha256};
    let mut bytes = b"sdns-bft-view-change-v1".to_vec();
    write_view_change(&mut bytes, view_change);
    Sha256::digest(&bytes).into()
}

/// Digest of a new-view message's content (relays are matched by it).
pub fn new_view_digest(new_view: &NewView) -> Digest {
    use sha2::{Digest as _, Sha256};
    let mut bytes = b"sdns-bft-new-view-v1".to_vec();
    write_new_view(&mut bytes, new_view);
    Sha256::digest(&bytes).into()
}

pub(crate) fn put_u64(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let low = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

pub(crate) fn put_len(out: &mut Vec<u8>, len: usize) {
    put_u64(out, len as u64);
}

fn write_request(out: &mut Vec<u8>, request: &Request) {
    put_u64(out, u64::from(request.origin));
    put_u64(out, request.client);
    put_u64(out, request.number);
    put_len(out, request.payload.len());
    out.extend_from_slice(&request.payload);
}

impl Proposal {
    /// The digest that prepares, commits and certificates refer to; it binds the sequence number.
    /// Over the proposal's encoding, so it lives with the codec.
    pub fn digest(&self, seq: u64) -> Digest {
        use sha2::{Digest as _, Sha256};
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(b"sdns-bft-proposal-v1");
        bytes.extend_from_slice(&seq.to_le_bytes());
        write_proposal(&mut bytes, self);
        Sha256::digest(&bytes).into()
    }
}

pub(crate) fn write_proposal(out: &mut Vec<u8>, proposal: &Proposal) {
    put_u64(out, proposal.time.0);
    put_len(out, proposal.requests.len());
    for request in &proposal.requests {
        write_request(out, request);
    }
}

pub(crate) fn write_checkpoint(out: &mut Vec<u8>, checkpoint: &CheckpointClaim) {
    put_u64(out, checkpoint.seq);
    put_u64(out, checkpoint.time.0);
    out.extend_from_slice(&checkpoint.log_digest);
    out.extend_from_slice(&checkpoint.state_digest);
}

pub(crate) fn write_view_change(out: &mut Vec<u8>, view_change: &ViewChange) {
    put_u64(out, u64::from(view_change.sender));
    put_u64(out, view_change.view);
    write_checkpoint(out, &view_change.stable);
    put_len(out, view_change.checkpoints.len());
    for checkpoint in &view_change.checkpoints {
        write_checkpoint(out, checkpoint);
    }
    put_len(out, view_change.prepared.len());
    for entry in &view_change.prepared {
        put_u64(out, entry.seq);
        put_u64(out, entry.view);
        write_proposal(out, &entry.proposal);
    }
    put_len(out, view_change.pre_prepared.len());
    for entry in &view_change.pre_prepared {
        put_u64(out, entry.seq);
        put_u64(out, entry.view);
        out.extend_from_slice(&entry.digest);
    }
}

pub(crate) fn write_new_view(out: &mut Vec<u8>, new_view: &NewView) {
    put_u64(out, new_view.view);
    put_len(out, new_view.view_changes.len());
    for (sender, digest) in &new_view.view_changes {
        put_u64(out, u64::from(*sender));
        out.extend_from_slice(digest);
    }
    write_checkpoint(out, &new_view.checkpoint);
    put_len(out, new_view.proposals.len());
    for (seq, proposal) in &new_view.proposals {
        put_u64(out, *seq);
        write_proposal(out, proposal);
    }
}

pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) position: usize,
    pub(crate) limits: Limits,
}

impl Reader<'_> {
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.position)
    }

    pub(crate) fn byte(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let value = *self.bytes.get(self.position).ok_or(DecodeError::Truncated(field))?;
        self.position += 1;
        Ok(value)
    }

    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.byte(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::OutOfRange { field, value: u64::from(other) }),
        }
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let mut value: u64 = 0;
        for index in 0..10u32 {
            let byte = self.byte(field)?;
            let bits = u64::from(byte & 0x7f);
            if index == 9 && bits > 1 {
                return Err(DecodeError::Varint(field));
            }
            value |= bits << (7 * index);
            if byte & 0x80 == 0 {
                // Canonical form only: no redundant trailing zero groups.
                if index > 0 && byte == 0 {
                    return Err(DecodeError::Varint(field));
                }
                return Ok(value);
            }
        }
        Err(DecodeError::Varint(field))
    }

    pub(crate) fn replica(&mut self) -> Result<ReplicaId, DecodeError> {
        let value = self.u64("sender")?;
        ReplicaId::try_from(value).map_err(|_| DecodeError::OutOfRange { field: "sender", value })
    }

    pub(crate) fn digest(&mut self) -> Result<Digest, DecodeError> {
        let end = self.position.checked_add(32).ok_or(DecodeError::Truncated("digest"))?;
        let slice = self.bytes.get(self.position..end).ok_or(DecodeError::Truncated("digest"))?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(slice);
        self.position = end;
        Ok(digest)
    }

    /// A count of elements each at least `min_size` bytes long, bounded by what is left.
    pub(crate) fn count(&mut self, field: &'static str, min_size: usize, limit: usize) -> Result<usize, DecodeError> {
        let count = self.u64(field)?;
        let fits = (self.remaining() / min_size.max(1)) as u64;
        if count > fits {
            return Err(DecodeError::Truncated(field));
        }
        if count > limit as u64 {
            return Err(DecodeError::TooMany { field, count });
        }
        Ok(count as usize)
    }

    pub(crate) fn request(&mut self) -> Result<Request, DecodeError> {
        let origin = self.replica()?;
        let client = self.u64("client")?;
        let number = self.u64("number")?;
        let length = self.count("payload", 1, usize::MAX)?;
        let end = self.position + length; // length <= remaining, so no overflow
        let payload = self.bytes.get(self.position..end).ok_or(DecodeError::Truncated("payload"))?.to_vec();
        self.position = end;
        Ok(Request { origin, client, number, payload })
    }

    pub(crate) fn proposal(&mut self) -> Result<Proposal, DecodeError> {
        let time = Time(self.u64("time")?);
        // A request is at least 4 bytes (three varints and a length).
        let count = self.count("requests", 4, usize::MAX)?;
        let mut requests = Vec::with_capacity(count);
        for _ in 0..count {
            requests.push(self.request()?);
        }
        Ok(Proposal { time, requests })
    }

    pub(crate) fn checkpoint(&mut self) -> Result<CheckpointClaim, DecodeError> {
        Ok(CheckpointClaim { seq: self.u64("seq")?, time: Time(self.u64("time")?), log_digest: self.digest()?, state_digest: self.digest()? })
    }

    pub(crate) fn view_change(&mut self) -> Result<ViewChange, DecodeError> {
        let sender = self.replica()?;
        let view = self.u64("view")?;
        let stable = self.checkpoint()?;
        let limit = self.limits.max_entries;
        let count = self.count("checkpoints", 66, limit)?;
        let mut checkpoints = Vec::with_capacity(count);
        for _ in 0..count {
            checkpoints.push(self.checkpoint()?);
        }
        let count = self.count("prepared", 4, limit)?;
        let mut prepared = Vec::with_capacity(count);
        for _ in 0..count {
            prepared.push(PreparedEntry { seq: self.u64("seq")?, view: self.u64("view")?, proposal: self.proposal()? });
        }
        // Q may hold a few digests per seq.
        let count = self.count("pre_prepared", 34, limit.saturating_mul(4))?;
        let mut pre_prepared = Vec::with_capacity(count);
        for _ in 0..count {
            pre_prepared.push(PrePreparedEntry { seq: self.u64("seq")?, view: self.u64("view")?, digest: self.digest()? });
        }
        Ok(ViewChange { sender, view, stable, checkpoints, prepared, pre_prepared })
    }

    pub(crate) fn new_view(&mut self) -> Result<NewView, DecodeError> {
        let view = self.u64("view")?;
        let count = self.count("view_changes", 33, usize::from(u16::MAX))?;
        let mut view_changes = Vec::with_capacity(count);
        for _ in 0..count {
            view_changes.push((self.replica()?, self.digest()?));
        }
        let checkpoint = self.checkpoint()?;
        let count = self.count("proposals", 3, self.limits.max_entries)?;
        let mut proposals = Vec::with_capacity(count);
        for _ in 0..count {
            proposals.push((self.u64("seq")?, self.proposal()?));
        }
        Ok(NewView { view, view_changes, checkpoint, proposals })
    }
}
