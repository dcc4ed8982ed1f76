//! The Watch stream's wire form: responses whose events were encoded once for every watcher
//! that gets them.
//!
//! With a thousand watchers of one prefix, each revision's events go out a thousand times, and
//! converting and encoding them per watcher was most of the server's work. The engine hands
//! a stream one delivery for all its watchers taking the same events; the stream encodes its
//! events once and sends them with each watcher's own header and watch ID.
//! The bytes are those prost would write for the same `WatchResponse` (fields in number
//! order, defaults left out; the test below checks it), so clients see no difference.

use bytes::{Bytes, BytesMut};
use prost::Message;
use smallvec::SmallVec;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;

use crate::api::convert;
use crate::pb::etcdserverpb as pb;

/// `WatchResponse` field numbers (rpc.proto).
const HEADER_FIELD: u32 = 1;
const WATCH_ID_FIELD: u32 = 2;
const EVENTS_FIELD: u32 = 11;

/// A response on a watch stream, as it goes on the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum WireResponse {
    /// Any response, encoded field by field.
    Message(pb::WatchResponse),
    /// Events of one or more revisions, encoded ahead of time, with this watcher's header
    /// and ID.
    Events {
        /// The response header, at the revision of the last events carried.
        header: pb::ResponseHeader,
        /// The watcher the events are for (left out of the bytes when 0, as prost leaves it).
        watch_id: i64,
        /// Each an encoded run of `events` fields, in order (one, unless runs were merged).
        events: SmallVec<[Bytes; 1]>,
    },
}

impl WireResponse {
    /// The response's bytes, as a client receives them (in a test).
    #[cfg(test)]
    pub(crate) fn encode_to_vec(&self) -> Vec<u8> {
        let mut buf = BytesMut::new();
        self.encode_raw(&mut buf);
        buf.to_vec()
    }

    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        match self {
            WireResponse::Message(m) => m.encode_raw(buf),
            WireResponse::Events {
                header,
                watch_id,
                events,
            } => {
                prost::encoding::message::encode(HEADER_FIELD, header, buf);
                if *watch_id != 0 {
                    prost::encoding::int64::encode(WATCH_ID_FIELD, watch_id, buf);
                }
                for run in events {
                    buf.put_slice(run);
                }
            }
        }
    }
}

/// Encodes `events` as the `events` fields of a `WatchResponse`.
pub fn encode_events(events: &[cairn_engine::Event]) -> Bytes {
    let mut buf = BytesMut::new();
    for e in events {
        prost::encoding::message::encode(EVENTS_FIELD, &convert::event(e.clone()), &mut buf);
    }
    buf.freeze()
}

/// Encodes [`WireResponse`]s.
#[derive(Debug, Default)]
pub struct WireEncoder;

impl Encoder for WireEncoder {
    type Item = WireResponse;
    type Error = Status;

    fn encode(&mut self, item: WireResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode_raw(dst);
        Ok(())
    }
}

/// The Watch service's codec: requests decoded by prost, responses as [`WireResponse`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = WireResponse;
    type Decode = pb::WatchRequest;
    type Encoder = WireEncoder;
    type Decoder = tonic_prost::ProstDecoder<pb::WatchRequest>;

    fn encoder(&mut self) -> WireEncoder {
        WireEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

#[cfg(test)]
mod tests {
    // Test code: a panic is a test failure, with the message to debug it.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use cairn_engine::{Event, EventKind, KeyValue};

    use super::*;

    fn event(revision: i64, prev: bool) -> Event {
        let kv = |revision: i64| KeyValue {
            key: Bytes::from_static(b"/registry/pods/default/p"),
            create_revision: 2,
            mod_revision: revision,
            version: revision - 1,
            value: Bytes::from(vec![7u8; 300]),
            lease: 5,
        };
        Event {
            kind: if revision % 2 == 0 {
                EventKind::Put
            } else {
                EventKind::Delete
            },
            kv: kv(revision),
            prev_kv: prev.then(|| kv(revision - 1)),
        }
    }

    fn wire(r: &WireResponse) -> Vec<u8> {
        r.encode_to_vec()
    }

    #[test]
    fn pre_encoded_events_are_the_bytes_prost_writes() {
        // The same response both ways: a watcher's header and ID, events of two revisions in
        // two runs (one with previous values); watch ID 0 is left out, as prost does.
        let header = pb::ResponseHeader {
            cluster_id: 11,
            member_id: 12,
            revision: 9,
            raft_term: 3,
        };
        let runs = [vec![event(4, false)], vec![event(5, true), event(6, true)]];
        for watch_id in [0, 1, 1 << 40] {
            let ours = WireResponse::Events {
                header,
                watch_id,
                events: runs.iter().map(|r| encode_events(r)).collect(),
            };
            let theirs = pb::WatchResponse {
                header: Some(header),
                watch_id,
                events: runs.iter().flatten().cloned().map(convert::event).collect(),
                ..pb::WatchResponse::default()
            };
            assert_eq!(wire(&ours), theirs.encode_to_vec(), "watch ID {watch_id}");
            assert_eq!(pb::WatchResponse::decode(wire(&ours).as_slice()).unwrap(), theirs);
        }
    }
}
