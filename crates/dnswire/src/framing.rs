//! DNS over TCP framing (RFC 1035 4.2.2, RFC 7766 8): every message preceded by its length as
//! two bytes in network order. The one implementation for the replica's client listener, its
//! forwarder to named and the voting client. Generic over tokio's byte streams; it does no IO
//! of its own and sets no deadlines (callers wrap it in theirs).

#[cfg(feature = "tokio")]
use std::io;

#[cfg(feature = "tokio")]
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest message a frame can carry.
pub const MAX_MESSAGE: usize = u16::MAX as usize;

/// `message` with its length prefix; `None` if it is longer than a frame can say.
pub fn frame(message: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(message.len()).ok()?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(message);
    Some(framed)
}

/// Writes one framed message in one write (so a peer never sees a lone length). A message
/// longer than [`MAX_MESSAGE`] is an `InvalidInput` error and nothing is written.
#[cfg(feature = "tokio")]
pub async fn write_message<W: AsyncWrite + Unpin>(stream: &mut W, message: &[u8]) -> io::Result<()> {
    let framed = frame(message)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("a DNS message of {} bytes does not fit a TCP frame", message.len())))?;
    stream.write_all(&framed).await
}

/// Reads one framed message. `Ok(None)`: the stream ended cleanly before a length; a stream
/// that ends inside a frame is an `UnexpectedEof` error.
#[cfg(feature = "tokio")]
pub async fn read_message<R: AsyncRead + Unpin>(stream: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    stream.read_exact(&mut len[1..]).await?;
    let mut message = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut message).await?;
    Ok(Some(message))
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_round_trip_and_ends_are_told_apart() {
        let (mut a, mut b) = tokio::io::duplex(1 << 17);
        write_message(&mut a, b"first").await.unwrap();
        write_message(&mut a, b"").await.unwrap();
        write_message(&mut a, &vec![7u8; MAX_MESSAGE]).await.unwrap();
        let too_long = write_message(&mut a, &vec![0u8; MAX_MESSAGE + 1]).await.unwrap_err();
        assert_eq!(too_long.kind(), io::ErrorKind::InvalidInput);
        drop(a);
        assert_eq!(read_message(&mut b).await.unwrap().as_deref(), Some(&b"first"[..]));
        assert_eq!(read_message(&mut b).await.unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(read_message(&mut b).await.unwrap().map(|m| m.len()), Some(MAX_MESSAGE));
        assert_eq!(read_message(&mut b).await.unwrap(), None, "a clean end");
        assert_eq!(frame(b"ab"), Some(vec![0, 2, b'a', b'b']));
    }

    #[tokio::test]
    async fn an_end_inside_a_frame_is_an_error() {
        for cut in [&[0u8][..], &[0, 5, b'a', b'b'][..]] {
            let (mut a, mut b) = tokio::io::duplex(64);
            a.write_all(cut).await.unwrap();
            drop(a);
            assert_eq!(read_message(&mut b).await.unwrap_err().kind(), io::ErrorKind::UnexpectedEof, "{cut:?}");
        }
    }
}
