//! Lets gRPC clients of every language talk to us over a unix socket.
//!
//! The h2 server under tonic refuses a request whose `:authority` is not a
//! valid URI authority with RST_STREAM(PROTOCOL_ERROR). gRPC C-core (Python's
//! grpcio, C++, Ruby) and grpc-java send the socket path, or its
//! %-encoding, as the authority of a unix-socket channel, so every one of
//! their calls failed (hyperium/h2#487 is still open). The authority means
//! nothing on a unix socket, so this stream sits between the socket and h2
//! and rewrites an authority h2 would refuse to `localhost`, as grpc-go and
//! kubelet send.
//!
//! Only the client-to-server direction is touched, and in it only header
//! blocks: each one is HPACK-decoded with the client's compression context
//! and re-encoded with a context of our own, which is the one h2 decodes
//! with. Every other frame passes byte for byte. Input this filter cannot
//! make sense of is handed to h2 unchanged from then on, so h2 still judges
//! (and refuses) malformed connections itself.
//!
//! Once a block was re-encoded, h2's decoder follows our encoder's context,
//! not the client's: a client block passed on as it came would then refer
//! to table entries h2 never saw, and could decode as other headers than the
//! client sent. So input this filter cannot make sense of after that point
//! ends the connection (a read error, which h2 treats as the connection's
//! loss) instead of reaching h2.
//!
//! A gRPC channel sends one authority on every call of a connection, so
//! the first request tells which kind of client this is. When its
//! authority is one h2 accepts (grpc-go, kubelet, the sidecars, tonic) the
//! block goes on as it came and so does the rest of the connection: h2's
//! decoder then shares the client's context, and decoding every header
//! block again here would cost about a tenth of a small call's CPU.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`, sent before the first frame.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer must accept (SETTINGS_MAX_FRAME_SIZE's
/// initial value); h2 refuses bigger frames unless it raised its setting.
const MAX_FRAME: usize = 16_384;
/// Bound on one header block (HEADERS plus CONTINUATIONs) we buffer.
const MAX_BLOCK: usize = 256 * 1024;
/// HPACK dynamic table size both sides use: h2 never advertises another.
const TABLE_SIZE: usize = 4096;
const READ_CHUNK: usize = 16 * 1024;

/// A header block in progress (HEADERS without END_HEADERS, then
/// CONTINUATIONs).
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
    /// The frames as received, handed on if the block cannot be re-encoded.
    raw: Vec<u8>,
}

enum Reencoded {
    /// The block as the client sent it.
    Verbatim,
    Block(Vec<u8>),
}

/// The client-to-server rewriting: bytes in, bytes for h2 out.
pub struct Rewriter {
    input: Vec<u8>,
    output: Vec<u8>,
    out_pos: usize,
    preface_left: usize,
    /// Bytes of the current non-header frame still to pass through as is.
    raw_left: usize,
    block: Option<Block>,
    passthrough: bool,
    /// A complete header block was handed to h2.
    seen_block: bool,
    /// A block was re-encoded: h2 decodes with our context from then on.
    reencoded: bool,
    /// Why the connection is to end (see the module's docs).
    broken: Option<String>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    rewritten: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Rewriter {
            input: Vec::new(),
            output: Vec::new(),
            out_pos: 0,
            preface_left: PREFACE_LEN,
            raw_left: 0,
            block: None,
            passthrough: false,
            seen_block: false,
            reencoded: false,
            broken: None,
            decoder,
            encoder: loona_hpack::Encoder::new(),
            rewritten: 0,
        }
    }
}

/// Whether h2 accepts `value` as a request authority.
fn valid_authority(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .is_some_and(|s| s.parse::<http::uri::Authority>().is_ok())
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; FRAME_HEADER_LEN] {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

impl Rewriter {
    /// How many requests had their authority replaced.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Takes bytes read from the client.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.broken.is_some() {
            return;
        }
        if self.passthrough && self.input.is_empty() {
            self.output.extend_from_slice(bytes);
            return;
        }
        self.input.extend_from_slice(bytes);
        self.process();
    }

    /// The client closed its side: whatever is left goes to h2 as it is.
    pub fn finish(&mut self) {
        if self.reencoded {
            // A partial block refers to the client's context: useless to h2,
            // and the connection ends here anyway.
            self.block = None;
            self.input.clear();
            return;
        }
        if let Some(block) = self.block.take() {
            self.output.extend_from_slice(&block.raw);
        }
        self.output.append(&mut self.input);
    }

    /// Bytes ready for h2.
    pub fn pending(&self) -> &[u8] {
        &self.output[self.out_pos..]
    }

    pub fn consume(&mut self, n: usize) {
        self.out_pos += n;
        if self.out_pos >= self.output.len() {
            self.output.clear();
            self.out_pos = 0;
        }
    }

    /// Why the connection must end, once what is pending went to h2.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    fn give_up(&mut self) {
        if self.reencoded {
            self.block = None;
            self.input.clear();
            self.broken = Some(
                "a client header block this filter cannot re-encode, after it re-encoded others: \
                 its table references would be wrong for h2; connection closed"
                    .into(),
            );
            return;
        }
        if let Some(block) = self.block.take() {
            self.output.extend_from_slice(&block.raw);
        }
        self.output.append(&mut self.input);
        self.passthrough = true;
    }

    fn process(&mut self) {
        let mut at = 0;
        loop {
            if self.passthrough {
                self.output.extend_from_slice(&self.input[at..]);
                at = self.input.len();
                break;
            }
            let avail = &self.input[at..];
            if avail.is_empty() {
                break;
            }
            if self.preface_left > 0 {
                let n = self.preface_left.min(avail.len());
                self.output.extend_from_slice(&avail[..n]);
                self.preface_left -= n;
                at += n;
                continue;
            }
            if self.raw_left > 0 {
                let n = self.raw_left.min(avail.len());
                self.output.extend_from_slice(&avail[..n]);
                self.raw_left -= n;
                at += n;
                continue;
            }
            if avail.len() < FRAME_HEADER_LEN {
                break;
            }
            let len = u32::from_be_bytes([0, avail[0], avail[1], avail[2]]) as usize;
            let (kind, flags) = (avail[3], avail[4]);
            let stream = u32::from_be_bytes([avail[5], avail[6], avail[7], avail[8]]) & 0x7fff_ffff;
            let is_header_frame = kind == HEADERS || kind == CONTINUATION;
            if !is_header_frame {
                if self.block.is_some() {
                    // RFC 9113 §6.10: nothing may interleave a header block.
                    self.input.drain(..at);
                    self.give_up();
                    return;
                }
                self.output.extend_from_slice(&avail[..FRAME_HEADER_LEN]);
                self.raw_left = len;
                at += FRAME_HEADER_LEN;
                continue;
            }
            if len > MAX_FRAME {
                self.input.drain(..at);
                self.give_up();
                return;
            }
            if avail.len() < FRAME_HEADER_LEN + len {
                break;
            }
            let frame = avail[..FRAME_HEADER_LEN + len].to_vec();
            at += FRAME_HEADER_LEN + len;
            if !self.header_frame(kind, flags, stream, &frame) {
                self.input.drain(..at);
                self.give_up();
                return;
            }
        }
        self.input.drain(..at);
    }

    /// Handles one HEADERS or CONTINUATION frame; false when the input
    /// makes no sense to us (h2 then sees it as it is).
    fn header_frame(&mut self, kind: u8, flags: u8, stream: u32, frame: &[u8]) -> bool {
        let payload = &frame[FRAME_HEADER_LEN..];
        let fragment = if kind == HEADERS {
            if self.block.is_some() {
                return false;
            }
            let mut start = 0;
            let mut pad = 0;
            if flags & PADDED != 0 {
                let Some(&p) = payload.first() else {
                    return false;
                };
                pad = p as usize;
                start = 1;
            }
            if flags & PRIORITY != 0 {
                start += 5;
            }
            if start + pad > payload.len() {
                return false;
            }
            self.block = Some(Block {
                stream,
                end_stream: flags & END_STREAM != 0,
                fragment: Vec::new(),
                raw: Vec::new(),
            });
            &payload[start..payload.len() - pad]
        } else {
            match &self.block {
                Some(b) if b.stream == stream => payload,
                _ => return false,
            }
        };
        let Some(block) = self.block.as_mut() else {
            return false;
        };
        block.fragment.extend_from_slice(fragment);
        block.raw.extend_from_slice(frame);
        if block.raw.len() > MAX_BLOCK {
            return false;
        }
        if flags & END_HEADERS == 0 {
            return true;
        }
        let Some(block) = self.block.take() else {
            return false;
        };
        let first = !self.seen_block;
        self.seen_block = true;
        match self.reencode(&block.fragment, first) {
            Some(Reencoded::Verbatim) => {
                // Nothing was re-encoded so far: h2's context is the
                // client's, and stays so with every byte passed as is.
                self.output.extend_from_slice(&block.raw);
                self.passthrough = true;
                true
            }
            Some(Reencoded::Block(encoded)) => {
                self.reencoded = true;
                self.emit(&encoded, block.stream, block.end_stream);
                true
            }
            None => {
                self.block = Some(block);
                false
            }
        }
    }

    /// The block h2 is to decode; `first` when no block went to h2 yet, so
    /// that a block with nothing to rewrite may go as it came.
    fn reencode(&mut self, fragment: &[u8], first: bool) -> Option<Reencoded> {
        let mut headers = self.decoder.decode(fragment).ok()?;
        let mut rewrite = false;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" && !valid_authority(value) {
                *value = b"localhost".to_vec();
                rewrite = true;
            }
        }
        if first && !rewrite {
            return Some(Reencoded::Verbatim);
        }
        if rewrite {
            self.rewritten += 1;
        }
        Some(Reencoded::Block(self.encoder.encode(
            headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
        )))
    }

    fn emit(&mut self, block: &[u8], stream: u32, end_stream: bool) {
        let mut chunks = block.chunks(MAX_FRAME).peekable();
        let mut kind = HEADERS;
        let mut first_flags = if end_stream { END_STREAM } else { 0 };
        if block.is_empty() {
            self.output.extend_from_slice(&frame_header(
                0,
                HEADERS,
                first_flags | END_HEADERS,
                stream,
            ));
            return;
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let flags = first_flags | if last { END_HEADERS } else { 0 };
            self.output
                .extend_from_slice(&frame_header(chunk.len(), kind, flags, stream));
            self.output.extend_from_slice(chunk);
            kind = CONTINUATION;
            first_flags = 0;
        }
    }
}

/// A server-side connection whose client-to-server bytes go through a
/// `Rewriter`.
pub struct AuthorityFilter<S> {
    inner: S,
    rewriter: Rewriter,
    eof: bool,
}

impl<S> AuthorityFilter<S> {
    pub fn new(inner: S) -> Self {
        AuthorityFilter {
            inner,
            rewriter: Rewriter::default(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFilter<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let pending = this.rewriter.pending();
            if !pending.is_empty() {
                let n = pending.len().min(buf.remaining());
                buf.put_slice(&pending[..n]);
                this.rewriter.consume(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(why) = this.rewriter.broken() {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    if read.filled().is_empty() {
                        this.eof = true;
                        this.rewriter.finish();
                    } else {
                        this.rewriter.feed(read.filled());
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFilter<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFilter<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn request_block(enc: &mut loona_hpack::Encoder<'static>, authority: &str) -> Vec<u8> {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/csi.v1.Identity/Probe"),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ];
        enc.encode(headers)
    }

    /// Splits the rewriter's output into (kind, flags, stream, payload).
    fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&out[..PREFACE_LEN], PREFACE);
        out = &out[PREFACE_LEN..];
        let mut v = Vec::new();
        while !out.is_empty() {
            let len = u32::from_be_bytes([0, out[0], out[1], out[2]]) as usize;
            let stream = u32::from_be_bytes([out[5], out[6], out[7], out[8]]);
            v.push((out[3], out[4], stream, out[9..9 + len].to_vec()));
            out = &out[9 + len..];
        }
        v
    }

    #[test]
    fn socket_path_authorities_become_localhost_and_contexts_stay_in_step() {
        let mut client = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        // SETTINGS, then two requests: the second refers to the first's
        // dynamic-table entries, and one is split over CONTINUATION.
        wire.extend_from_slice(&frame_header(0, 0x4, 0, 0));
        let b1 = request_block(&mut client, "/run/csi/csi.sock");
        wire.extend_from_slice(&frame_header(b1.len(), HEADERS, END_HEADERS, 1));
        wire.extend_from_slice(&b1);
        wire.extend_from_slice(&frame_header(5, 0x0, END_STREAM, 1));
        wire.extend_from_slice(&[0, 0, 0, 0, 0]);
        let b2 = request_block(&mut client, "%2Frun%2Fcsi%2Fcsi.sock");
        let (a, b) = b2.split_at(b2.len() / 2);
        wire.extend_from_slice(&frame_header(a.len() + 1 + 2, HEADERS, PADDED, 3));
        wire.push(2);
        wire.extend_from_slice(a);
        wire.extend_from_slice(&[0, 0]);
        wire.extend_from_slice(&frame_header(b.len(), CONTINUATION, END_HEADERS, 3));
        wire.extend_from_slice(b);
        let b3 = request_block(&mut client, "localhost:1234");

        let mut r = Rewriter::default();
        // Byte by byte: frames split anywhere are reassembled.
        for byte in &wire {
            r.feed(std::slice::from_ref(byte));
        }
        r.feed(&frame_header(
            b3.len(),
            HEADERS,
            END_HEADERS | END_STREAM,
            5,
        ));
        r.feed(&b3);
        let out = r.pending().to_vec();
        let frames = frames(&out);
        let mut h2 = loona_hpack::Decoder::new();
        let headers: Vec<_> = frames
            .iter()
            .filter(|f| f.0 == HEADERS)
            .map(|f| h2.decode(&f.3).unwrap())
            .collect();
        let authority = |h: &Vec<(Vec<u8>, Vec<u8>)>| {
            h.iter()
                .find(|(n, _)| n == b":authority")
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        assert_eq!(headers.len(), 3);
        assert_eq!(authority(&headers[0]).as_deref(), Some("localhost"));
        assert_eq!(authority(&headers[1]).as_deref(), Some("localhost"));
        assert_eq!(authority(&headers[2]).as_deref(), Some("localhost:1234"));
        assert!(headers[1]
            .iter()
            .any(|(n, v)| n == b":path" && v == b"/csi.v1.Identity/Probe"));
        assert_eq!(r.rewritten(), 2);
        // Flags survive: END_STREAM on the third, DATA untouched.
        assert_eq!(frames.last().unwrap().1, END_HEADERS | END_STREAM);
        assert!(frames
            .iter()
            .any(|f| f.0 == 0 && f.3 == [0, 0, 0, 0, 0] && f.1 == END_STREAM));
    }

    #[test]
    fn a_client_whose_first_authority_is_valid_is_passed_through_untouched() {
        let mut client = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        wire.extend_from_slice(&frame_header(0, 0x4, 0, 0));
        let b1 = request_block(&mut client, "localhost");
        // Padded, as a client may send it: it still goes as it came.
        wire.extend_from_slice(&frame_header(
            b1.len() + 3,
            HEADERS,
            END_HEADERS | PADDED,
            1,
        ));
        wire.push(2);
        wire.extend_from_slice(&b1);
        wire.extend_from_slice(&[0, 0]);
        wire.extend_from_slice(&frame_header(5, 0x0, END_STREAM, 1));
        wire.extend_from_slice(&[0, 0, 0, 0, 0]);
        // Later blocks index the client's table: h2 shares it.
        for stream in [3u32, 5] {
            let b = request_block(&mut client, "localhost");
            wire.extend_from_slice(&frame_header(b.len(), HEADERS, END_HEADERS, stream));
            wire.extend_from_slice(&b);
        }
        let mut r = Rewriter::default();
        for chunk in wire.chunks(7) {
            r.feed(chunk);
        }
        assert_eq!(r.pending(), wire.as_slice());
        assert!(r.passthrough);
        assert_eq!(r.rewritten(), 0);
    }

    #[test]
    fn a_valid_authority_after_a_rewritten_one_is_still_reencoded() {
        // Once h2 decodes with our context, every block must be ours.
        let mut client = loona_hpack::Encoder::new();
        let mut r = Rewriter::default();
        r.feed(PREFACE);
        for (stream, authority) in [(1u32, "/run/csi.sock"), (3, "localhost")] {
            let b = request_block(&mut client, authority);
            r.feed(&frame_header(b.len(), HEADERS, END_HEADERS, stream));
            r.feed(&b);
        }
        let out = r.pending().to_vec();
        let mut h2 = loona_hpack::Decoder::new();
        let decoded: Vec<_> = frames(&out)
            .iter()
            .map(|f| h2.decode(&f.3).unwrap())
            .collect();
        assert!(!r.passthrough);
        assert_eq!(decoded.len(), 2);
        assert!(decoded[1]
            .iter()
            .any(|(n, v)| n == b":authority" && v == b"localhost"));
        assert_eq!(r.rewritten(), 1);
    }

    #[test]
    fn undecodable_input_reaches_h2_unchanged() {
        let mut wire = PREFACE.to_vec();
        // An HPACK index that does not exist.
        wire.extend_from_slice(&frame_header(1, HEADERS, END_HEADERS, 1));
        wire.push(0xff);
        wire.extend_from_slice(&frame_header(3, 0x0, 0, 1));
        wire.extend_from_slice(b"abc");
        let mut r = Rewriter::default();
        r.feed(&wire);
        assert_eq!(r.pending(), wire.as_slice());
        // An oversized header frame as well.
        let mut r = Rewriter::default();
        let mut big = PREFACE.to_vec();
        big.extend_from_slice(&frame_header(MAX_FRAME + 1, HEADERS, 0, 1));
        big.extend_from_slice(&[0; 10]);
        r.feed(&big);
        assert_eq!(r.pending(), big.as_slice());
    }

    // Over a real stream: what h2 reads ends in an error once a block
    // cannot be re-encoded after one was, and nothing of that block or
    // after it comes through.
    #[tokio::test]
    async fn the_connection_ends_in_an_error_when_a_block_cannot_follow_a_rewritten_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut client = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        let b1 = request_block(&mut client, "/run/csi.sock");
        wire.extend_from_slice(&frame_header(b1.len(), HEADERS, END_HEADERS, 1));
        wire.extend_from_slice(&b1);
        // An oversized header frame: not re-encodable, not passable as is.
        wire.extend_from_slice(&frame_header(MAX_FRAME + 1, HEADERS, END_HEADERS, 3));
        wire.extend_from_slice(&vec![0; MAX_FRAME + 1]);
        let (mut near, far) = tokio::io::duplex(1 << 20);
        near.write_all(&wire).await.unwrap();
        drop(near);
        let mut filtered = AuthorityFilter::new(far);
        let mut read = Vec::new();
        let err = filtered.read_to_end(&mut read).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let frames = frames(&read);
        assert_eq!(frames.len(), 1, "only the rewritten block reached h2");
        let headers = loona_hpack::Decoder::new().decode(&frames[0].3).unwrap();
        assert!(headers
            .iter()
            .any(|(n, v)| n == b":authority" && v == b"localhost"));
    }

    /// What the client sends, request by request.
    #[derive(Debug, Clone)]
    enum Sent {
        /// A request with this authority and a header that varies the
        /// tables' contents.
        Request(&'static str, u16),
        /// A request whose block is larger than this filter buffers, over
        /// CONTINUATIONs: it cannot be re-encoded.
        Oversized,
    }

    fn sent() -> impl proptest::strategy::Strategy<Value = Sent> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (prop::sample::select(vec!["/run/csi/csi.sock", "localhost", "%2Frun%2Fcsi.sock", "127.0.0.1:9"]), 0u16..40)
                .prop_map(|(a, n)| Sent::Request(a, n)),
            1 => Just(Sent::Oversized),
        ]
    }

    fn headers_of(sent: &Sent) -> HeaderList {
        let (authority, extra) = match sent {
            Sent::Request(a, n) => (a.to_string(), format!("v{n}").into_bytes()),
            Sent::Oversized => ("localhost".into(), vec![b'x'; MAX_BLOCK + 1000]),
        };
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/csi.v1.Node/NodeGetInfo"),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"x-extra", extra.as_slice()),
        ]
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
    }

    /// The header blocks in what the filter hands h2, decoded as h2 would
    /// (one context for the connection); stops at the first that does not
    /// decode.
    type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

    fn decoded_by_h2(mut out: &[u8]) -> Vec<Result<HeaderList, ()>> {
        out = &out[PREFACE_LEN..];
        let mut h2 = loona_hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        while out.len() >= FRAME_HEADER_LEN {
            let len = u32::from_be_bytes([0, out[0], out[1], out[2]]) as usize;
            let (kind, flags) = (out[3], out[4]);
            let payload = &out[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
            if kind == HEADERS || kind == CONTINUATION {
                block.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    let decoded = h2.decode(&block).map_err(|_| ());
                    let failed = decoded.is_err();
                    blocks.push(decoded);
                    block.clear();
                    if failed {
                        break;
                    }
                }
            }
            out = &out[FRAME_HEADER_LEN + len..];
        }
        blocks
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        // Rewritten blocks, blocks passed as they came and blocks this
        // filter cannot handle, in any order and split anywhere: every
        // header list h2 decodes is exactly the client's (with a socket
        // path authority made `localhost`), and none is decoded against a
        // context it was not encoded in.
        #[test]
        fn every_header_list_h2_decodes_is_the_clients(
            sends in proptest::collection::vec(sent(), 1..12),
            chunk in 1usize..5000,
        ) {
            let mut client = loona_hpack::Encoder::new();
            let mut wire = PREFACE.to_vec();
            wire.extend_from_slice(&frame_header(0, 0x4, 0, 0));
            for (i, s) in sends.iter().enumerate() {
                let stream = 1 + 2 * i as u32;
                let headers = headers_of(s);
                let block = client.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
                let mut chunks = block.chunks(MAX_FRAME).peekable();
                let mut kind = HEADERS;
                while let Some(c) = chunks.next() {
                    let flags = if chunks.peek().is_none() { END_HEADERS } else { 0 };
                    wire.extend_from_slice(&frame_header(c.len(), kind, flags, stream));
                    wire.extend_from_slice(c);
                    kind = CONTINUATION;
                }
                wire.extend_from_slice(&frame_header(5, 0x0, END_STREAM, stream));
                wire.extend_from_slice(&[0, 0, 0, 0, 1]);
            }
            let mut r = Rewriter::default();
            for c in wire.chunks(chunk) {
                r.feed(c);
            }
            let out = r.pending().to_vec();
            // The first complete block decides: as it came, or rewritten.
            let rewriting = matches!(sends[0], Sent::Request(a, _) if !valid_authority(a.as_bytes()));
            let expected: Vec<_> = sends
                .iter()
                .take_while(|s| !(rewriting && matches!(s, Sent::Oversized)))
                .map(|s| {
                    let mut h = headers_of(s);
                    if rewriting {
                        for (n, v) in h.iter_mut() {
                            if n == b":authority" && !valid_authority(v) {
                                *v = b"localhost".to_vec();
                            }
                        }
                    }
                    h
                })
                .collect();
            let got = decoded_by_h2(&out);
            proptest::prop_assert_eq!(got.len(), expected.len());
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                proptest::prop_assert!(g.as_ref() == Ok(e), "block {} decoded as {:?}", i, g.as_ref().map(|h| h.iter().map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), v.len())).collect::<Vec<_>>()));
            }
            let ends = rewriting && sends.iter().any(|s| matches!(s, Sent::Oversized));
            proptest::prop_assert_eq!(r.broken().is_some(), ends);
        }
    }
}
