//! Any `:authority` accepted, as Go's HTTP/2 server (and so etcd) accepts it, where h2 resets
//! a request whose `:authority` is not a URI authority. Clients in the field send such ones:
//! etcd's Go client 3.5.0–3.5.9 sends `#initially=[<endpoints>]` (etcd #13192, #16324),
//! etcdctl 3.4 a whole URL for its per-endpoint commands, some an empty value. cairn routes
//! by path and never reads the authority, so such an authority is left out of the request.
//!
//! [`Authorities`] reads every header block the client sends, with an HPACK decoder that keeps
//! the client's dynamic table (`hpack`), and says what h2 gets:
//!
//! - **The block unchanged**, while no authority so far was invalid. h2's decoder then sees
//!   exactly what this one saw, and the two tables stay equal. This is every connection of
//!   every client but the ones above, and it costs a decoding of each block.
//! - **A block of its own**, once one authority was invalid, for that block and every later
//!   one on the connection: the headers this decoder read, the invalid authority left out, each
//!   written as a literal that is not indexed. h2's table then never changes again, and no
//!   representation sent to h2 refers to it, so the two decoders cannot disagree whatever the
//!   client's encoder does to its own table after that.
//!
//! A block this decoder cannot read (a client's error, or an encoding it does not accept) is
//! reported; the caller then passes the rest of the connection unread while blocks are
//! unchanged (h2 sees what the client sent, and answers its error), and ends the connection
//! once they are rewritten (h2 could no longer be kept in step).

use super::hpack::{Decoder, Error};

/// The largest dynamic table a client may use: HTTP/2's default SETTINGS_HEADER_TABLE_SIZE,
/// which hyper's server never changes.
pub const TABLE_SIZE: usize = 4096;

/// The header blocks of one connection.
pub struct Authorities {
    decoder: Decoder,
    /// Invariant: once true, never false again; every block is then rewritten.
    rewriting: bool,
    /// The current block's names and values, one after another, and where each ends.
    scratch: Vec<u8>,
    fields: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Authorities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorities")
            .field("rewriting", &self.rewriting)
            .finish_non_exhaustive()
    }
}

/// What h2 gets for a block.
#[derive(Debug, PartialEq, Eq)]
pub enum Block {
    /// The block as the client sent it.
    Unchanged,
    /// This block instead.
    Rewritten(Vec<u8>),
}

impl Default for Authorities {
    fn default() -> Self {
        Authorities {
            decoder: Decoder::new(TABLE_SIZE),
            rewriting: false,
            scratch: Vec::new(),
            fields: Vec::new(),
        }
    }
}

/// Whether h2 takes `value` as an `:authority`.
pub fn is_valid(value: &[u8]) -> bool {
    axum::http::uri::Authority::try_from(value).is_ok()
}

impl Authorities {
    /// Whether blocks are rewritten: some authority on the connection was invalid.
    pub fn rewriting(&self) -> bool {
        self.rewriting
    }

    /// Reads the client's next header block (`fragment`: the HEADERS frame's and its
    /// CONTINUATIONs' fragments, joined).
    pub fn block(&mut self, fragment: &[u8]) -> Result<Block, Error> {
        self.scratch.clear();
        self.fields.clear();
        let mut invalid = false;
        let (scratch, fields) = (&mut self.scratch, &mut self.fields);
        self.decoder.decode(fragment, |name, value| {
            if name == b":authority" && !is_valid(value) {
                invalid = true;
            }
            scratch.extend_from_slice(name);
            let name_end = scratch.len();
            scratch.extend_from_slice(value);
            fields.push((name_end, scratch.len()));
        })?;
        if !invalid && !self.rewriting {
            return Ok(Block::Unchanged);
        }
        if invalid && !self.rewriting {
            tracing::debug!("a client sent an :authority that is not a URI authority, as Go's server accepts: its header blocks are rewritten from now on");
        }
        self.rewriting = true;
        let mut out = Vec::with_capacity(self.scratch.len() + 4 * self.fields.len());
        let mut start = 0;
        for &(name_end, end) in &self.fields {
            let name = self.scratch.get(start..name_end).unwrap_or_default();
            let value = self.scratch.get(name_end..end).unwrap_or_default();
            start = end;
            if name == b":authority" && !is_valid(value) {
                continue;
            }
            literal_not_indexed(&mut out, name, value);
        }
        Ok(Block::Rewritten(out))
    }
}

/// HPACK's literal header field without indexing, with a literal name, neither string
/// Huffman-coded (RFC 7541, section 6.2.2).
fn literal_not_indexed(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    for s in [name, value] {
        super::hpack::encode_integer(out, s.len(), 7, 0);
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(decoder: &mut loona_hpack::Decoder<'_>, block: &[u8]) -> Vec<(String, String)> {
        decoder
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    fn request(authority: &str) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (b":path", b"/etcdserverpb.KV/Range".to_vec()),
            (b":authority", authority.as_bytes().to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
        ]
    }

    /// The client's encoder (which indexes everything it can) and h2's decoder, with this
    /// layer between them: what h2 decodes, block after block.
    fn through(requests: &[&str]) -> Vec<Vec<(String, String)>> {
        let mut client = loona_hpack::Encoder::new();
        let mut layer = Authorities::default();
        let mut h2 = loona_hpack::Decoder::new();
        requests
            .iter()
            .map(|authority| {
                let headers = request(authority);
                let block = client.encode(headers.iter().map(|(n, v)| (*n, &v[..])));
                let passed = match layer.block(&block).unwrap() {
                    Block::Unchanged => block,
                    Block::Rewritten(b) => b,
                };
                decode(&mut h2, &passed)
            })
            .collect()
    }

    #[test]
    fn valid_authorities_pass_unchanged() {
        assert!(is_valid(b"127.0.0.1:2379"));
        assert!(is_valid(b"etcd-0.etcd"));
        let mut layer = Authorities::default();
        let mut client = loona_hpack::Encoder::new();
        for _ in 0..3 {
            let headers = request("127.0.0.1:2379");
            let block = client.encode(headers.iter().map(|(n, v)| (*n, &v[..])));
            assert_eq!(layer.block(&block).unwrap(), Block::Unchanged);
        }
        assert!(!layer.rewriting());
    }

    #[test]
    fn etcds_invalid_authorities_are_left_out_and_the_rest_kept_in_order() {
        for bad in [
            "#initially=[http://127.0.0.1:2379;http://127.0.0.1:22379]",
            "http://127.0.0.1:2379",
            "",
        ] {
            assert!(!is_valid(bad.as_bytes()), "{bad:?}");
            let seen = through(&[bad]);
            let names: Vec<&str> = seen[0].iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, [":method", ":scheme", ":path", "content-type"], "{bad:?}");
        }
    }

    #[test]
    fn h2_stays_in_step_after_the_first_invalid_authority_whatever_the_client_indexes() {
        let requests = [
            "127.0.0.1:2379",
            "#initially=[http://a:1;http://b:2]",
            "#initially=[http://a:1;http://b:2]",
            "127.0.0.1:2379",
            "http://c:3",
        ];
        let seen = through(&requests);
        for (authority, headers) in requests.iter().zip(&seen) {
            let mut expected: Vec<(String, String)> = request(authority)
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n.to_vec()).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            expected.retain(|(n, v)| n != ":authority" || is_valid(v.as_bytes()));
            assert_eq!(headers, &expected, "{authority}");
        }
    }

    #[test]
    fn a_block_the_decoder_cannot_read_is_an_error() {
        let mut layer = Authorities::default();
        // An index past the end of both tables.
        assert!(layer.block(&[0xff, 0x7f]).is_err());
        // A table size update above what the client was allowed.
        let mut over = Vec::new();
        let _ = loona_hpack::encoder::encode_integer_into(TABLE_SIZE + 1, 5, 0x20, &mut over);
        over.push(0x82);
        assert!(Authorities::default().block(&over).is_err());
    }
}
