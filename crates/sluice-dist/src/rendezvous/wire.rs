//! The rendezvous' wire format: one tag byte, a `u32` little-endian length and that many bytes per message; the
//! Hello's fields as fixed-width integers and length-prefixed byte strings.

use std::io::{self, Read};

/// The first bytes of a Hello: a connection that does not start with them is not a Sluice rank and is dropped.
pub(super) const MAGIC: &[u8; 8] = b"SLUICE\x00\x01";
/// The largest message accepted; anything longer is a protocol error (the payload is a few hundred bytes).
pub(super) const MAX_FRAME: usize = 16 << 20;

pub(super) const HELLO: u8 = 1;
pub(super) const WELCOME: u8 = 2;
pub(super) const REJECT: u8 = 3;
pub(super) const PING: u8 = 4;
pub(super) const BYE: u8 = 5;
pub(super) const LOST: u8 = 6;

pub(super) fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(tag);
    // Bodies are built here and stay far below 4 GiB.
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads one whole frame (handshake only: the read timeout bounds it).
pub(super) fn read_frame(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a message of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// Takes the first complete frame off `buf`, if there is one; an error for a length beyond the limit.
pub(super) fn take_frame(buf: &mut Vec<u8>) -> std::result::Result<Option<(u8, Vec<u8>)>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_FRAME {
        return Err(format!("sent a malformed message (a frame of {len} bytes)"));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let tag = buf[0];
    let body = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some((tag, body)))
}

pub(super) fn parse_hello(body: &[u8]) -> Option<(u64, u64, String)> {
    let rest = body.strip_prefix(MAGIC.as_slice())?;
    let mut r = Cursor(rest);
    Some((r.u64()?, r.u64()?, r.string()?))
}

pub(super) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads the fields `put_u64` and `put_bytes` wrote; `None` past the end.
pub(super) struct Cursor<'a>(pub(super) &'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub(super) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?);
        self.take(len as usize)
    }

    pub(super) fn string(&mut self) -> Option<String> {
        Some(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
}
