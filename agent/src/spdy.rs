//! A SPDY/3.1 client session, only as much as Kubernetes' streams use toward a container
//! runtime's streaming server: opening streams with headers (SYN_STREAM), data with and without
//! FIN, and reading the server's data, replies, pings, resets and GOAWAY. Header blocks are
//! zlib-compressed with SPDY/3's dictionary, one compression context per direction for the
//! whole connection, so every block is inflated in order even when its headers are not needed.
//! Flow control (WINDOW_UPDATE) is not sent: Kubernetes' streaming servers do not enforce it.

use std::io;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u16 = 3;
const FLAG_FIN: u8 = 0x01;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
/// Largest frame payload accepted from the server (SPDY allows 2^24 - 1).
const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// Largest data frame this side writes.
pub const MAX_DATA: usize = 32 * 1024;

/// The header names SPDY/3 seeds its zlib dictionary with, each length-prefixed (u32).
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The rest of SPDY/3's dictionary, as it follows the words.
const DICTIONARY_TAIL: &str = "100101201202205206300302303304305306307402405406407408409410\
411412413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved \
Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server \
Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov \
Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,\
image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivate\
max-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// SPDY/3's header compression dictionary (1,423 bytes).
fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
}

/// What the server sent, as far as the session cares.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// The server reset a stream (refused it, or gave up on it).
    Reset { stream: u32, status: u32 },
    /// A ping to answer with the same id.
    Ping(u32),
    /// The server is closing the connection.
    GoAway,
    /// Replies, settings, window updates: nothing to act on.
    Other,
}

/// The writing half: frames out, headers compressed in one context.
pub struct Writer<W> {
    io: W,
    deflate: Compress,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub fn new(io: W) -> io::Result<Writer<W>> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&dictionary())
            .map_err(io::Error::other)?;
        Ok(Writer { io, deflate })
    }

    /// Opens client stream `id` (odd, increasing) with `headers` (names lower case).
    pub async fn syn_stream(&mut self, id: u32, headers: &[(&str, &str)]) -> io::Result<()> {
        let mut block = Vec::new();
        block.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            block.extend_from_slice(&(name.len() as u32).to_be_bytes());
            block.extend_from_slice(name.as_bytes());
            block.extend_from_slice(&(value.len() as u32).to_be_bytes());
            block.extend_from_slice(value.as_bytes());
        }
        let compressed = self.compress(&block)?;
        let mut payload = Vec::with_capacity(10 + compressed.len());
        payload.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes());
        // Priority 0 (highest) in the top three bits, then the unused slot.
        payload.extend_from_slice(&[0, 0]);
        payload.extend_from_slice(&compressed);
        self.control(SYN_STREAM, 0, &payload).await
    }

    /// Data on stream `id`; with `fin`, this side's last (an empty frame just closes).
    pub async fn data(&mut self, id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut chunks = data.chunks(MAX_DATA).peekable();
        if chunks.peek().is_none() {
            return self.data_frame(id, &[], fin).await;
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            self.data_frame(id, chunk, fin && last).await?;
        }
        Ok(())
    }

    /// Answers the server's ping `id`.
    pub async fn ping(&mut self, id: u32) -> io::Result<()> {
        self.control(PING, 0, &id.to_be_bytes()).await
    }

    async fn data_frame(&mut self, id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
        head[4] = if fin { FLAG_FIN } else { 0 };
        head[5..].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        self.io.write_all(&head).await?;
        self.io.write_all(data).await?;
        self.io.flush().await
    }

    async fn control(&mut self, kind: u16, flags: u8, payload: &[u8]) -> io::Result<()> {
        let mut head = [0u8; 8];
        head[..2].copy_from_slice(&(0x8000 | VERSION).to_be_bytes());
        head[2..4].copy_from_slice(&kind.to_be_bytes());
        head[4] = flags;
        head[5..].copy_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        self.io.write_all(&head).await?;
        self.io.write_all(payload).await?;
        self.io.flush().await
    }

    fn compress(&mut self, input: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(input.len() + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(1024);
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&input[pos..], &mut out, FlushCompress::Sync)
                .map_err(io::Error::other)?;
            pos += (self.deflate.total_in() - before) as usize;
            // Done when all input is taken and the flush fitted (room was left over).
            if pos >= input.len() && out.capacity() - out.len() >= 64 {
                return Ok(out);
            }
        }
    }
}

/// The reading half: frames in, header blocks inflated in one context.
pub struct Reader<R> {
    io: R,
    inflate: Decompress,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub fn new(io: R) -> Reader<R> {
        Reader {
            io,
            inflate: Decompress::new(true),
        }
    }

    /// The next frame; None when the server closed the connection between frames.
    pub async fn next(&mut self) -> io::Result<Option<Frame>> {
        let mut head = [0u8; 8];
        match self.io.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(io::Error::other("a SPDY frame longer than 2^24 bytes"));
        }
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await?;
        if head[0] & 0x80 == 0 {
            return Ok(Some(Frame::Data {
                stream: u32::from_be_bytes([head[0], head[1], head[2], head[3]]),
                fin: flags & FLAG_FIN != 0,
                data: payload,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(io::Error::other(format!(
                "the streaming server speaks SPDY version {version}, not 3"
            )));
        }
        let word = |at: usize| -> io::Result<u32> {
            payload
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0] & 0x7f, b[1], b[2], b[3]]))
                .ok_or_else(|| io::Error::other("a short SPDY control frame"))
        };
        Ok(Some(match u16::from_be_bytes([head[2], head[3]]) {
            // Header blocks are inflated to keep the shared context in step.
            SYN_STREAM => {
                self.inflate_block(payload.get(10..).unwrap_or_default())?;
                Frame::Other
            }
            SYN_REPLY | HEADERS => {
                self.inflate_block(payload.get(4..).unwrap_or_default())?;
                Frame::Other
            }
            RST_STREAM => Frame::Reset {
                stream: word(0)?,
                status: word(4)?,
            },
            PING => Frame::Ping(word(0)?),
            GOAWAY => Frame::GoAway,
            _ => Frame::Other,
        }))
    }

    fn inflate_block(&mut self, input: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(input.len() * 4 + 256);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 256 {
                out.reserve(4096);
            }
            let before = self.inflate.total_in();
            let result =
                self.inflate
                    .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            pos += (self.inflate.total_in() - before) as usize;
            match result {
                Ok(Status::StreamEnd) => return Ok(out),
                Ok(_) if pos >= input.len() && out.capacity() - out.len() >= 256 => return Ok(out),
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&dictionary())
                        .map_err(io::Error::other)?;
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b",*,enq=0."));
    }

    /// What one side writes the other reads: data with and without FIN, pings, and header
    /// blocks through one compression context (a second block reuses the first's).
    #[tokio::test]
    async fn frames_round_trip() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut w = Writer::new(a).unwrap();
        let mut r = Reader::new(b);
        w.syn_stream(1, &[("streamtype", "error")]).await.unwrap();
        w.syn_stream(3, &[("streamtype", "stdin")]).await.unwrap();
        w.data(3, b"hello", false).await.unwrap();
        w.data(3, &[], true).await.unwrap();
        w.ping(2).await.unwrap();
        // The writer's SYN_STREAMs read back as frames whose blocks inflate.
        assert_eq!(r.next().await.unwrap(), Some(Frame::Other));
        assert_eq!(r.next().await.unwrap(), Some(Frame::Other));
        assert_eq!(
            r.next().await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                fin: false,
                data: b"hello".to_vec()
            })
        );
        assert_eq!(
            r.next().await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                fin: true,
                data: vec![]
            })
        );
        assert_eq!(r.next().await.unwrap(), Some(Frame::Ping(2)));
        drop(w);
        assert_eq!(r.next().await.unwrap(), None);
    }

    #[test]
    fn header_blocks_inflate_to_what_was_written() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut w = Writer::new(Vec::new()).unwrap();
            let block = [0, 0, 0, 1, 0, 0, 0, 1, b'a', 0, 0, 0, 1, b'b'];
            let first = w.compress(&block).unwrap();
            let second = w.compress(&block).unwrap();
            let mut r = Reader::new(tokio::io::empty());
            assert_eq!(r.inflate_block(&first).unwrap(), block);
            assert_eq!(r.inflate_block(&second).unwrap(), block);
        });
    }
}
