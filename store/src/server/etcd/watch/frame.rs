//! A Watch response as it goes on the wire, put together from parts that are encoded once and
//! shared. Every watcher of a revision gets a response of its own (etcd's protocol names one
//! `watch_id` per response), but the header and the events are the same bytes for all the
//! watchers of a stream that want them: they are encoded once per stream and revision, and
//! each watcher's response only adds its id between them. A revision that a watcher wants
//! whole comes as the hub's own batch ([`crate::mvcc::watch::SetMessage::Shared`]), encoded
//! once for the stream; a watcher that wants part of one gets those events encoded for it
//! alone. (Sharing the encoding of single events as well saved no CPU: BENCHMARKS.md,
//! 2026-12-06.)

use std::sync::Arc;

use bytes::{BufMut, Bytes};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use super::super::event_to_pb;
use crate::mvcc::store::RevisionBatch;
use crate::mvcc::Event;
use crate::proto::etcdserverpb as pb;

/// `WatchResponse.header`, `WatchResponse.watch_id` and `WatchResponse.events` (rpc.proto).
const HEADER_FIELD: u32 = 1;
const WATCH_ID_FIELD: u32 = 2;
const EVENTS_FIELD: u32 = 11;

/// One `etcdserverpb.WatchResponse`, ready to be written. It is only ever encoded: the
/// service's codec decodes `WatchRequest`s, never this.
#[derive(Debug, Clone)]
pub enum WatchFrame {
    /// A response encoded whole (created, canceled, progress: one per watcher, rare).
    Whole(Bytes),
    /// One revision's events for one watcher: the shared header field, the watcher's id, and
    /// the fields of the events it wants, in the order of the revision.
    Events {
        header: Bytes,
        watch_id: i64,
        events: Bytes,
    },
}

impl WatchFrame {
    pub fn whole(response: &pb::WatchResponse) -> WatchFrame {
        WatchFrame::Whole(response.encode_to_vec().into())
    }
}

impl Message for WatchFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            WatchFrame::Whole(b) => buf.put_slice(b),
            WatchFrame::Events {
                header,
                watch_id,
                events,
            } => {
                // Fields in number order, as prost writes a WatchResponse; proto3 leaves a
                // zero id out.
                buf.put_slice(header);
                if *watch_id != 0 {
                    encode_key(WATCH_ID_FIELD, WireType::Varint, buf);
                    encode_varint(*watch_id as u64, buf);
                }
                buf.put_slice(events);
            }
        }
    }

    fn merge_field(
        &mut self,
        _tag: u32,
        _wire_type: WireType,
        _buf: &mut impl bytes::Buf,
        _ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        Err(prost::DecodeError::new(
            "a WatchFrame is written, not read: decode an etcdserverpb.WatchResponse",
        ))
    }

    fn encoded_len(&self) -> usize {
        match self {
            WatchFrame::Whole(b) => b.len(),
            WatchFrame::Events {
                header,
                watch_id,
                events,
            } => {
                let id = if *watch_id != 0 {
                    key_len(WATCH_ID_FIELD) + encoded_len_varint(*watch_id as u64)
                } else {
                    0
                };
                header.len() + id + events.len()
            }
        }
    }

    fn clear(&mut self) {
        *self = WatchFrame::Whole(Bytes::new());
    }
}

/// A field of a message, encoded with its key and length.
fn field<M: Message>(number: u32, message: &M) -> Bytes {
    let mut buf = Vec::with_capacity(message.encoded_len() + 8);
    prost::encoding::message::encode(number, message, &mut buf);
    buf.into()
}

/// The encoded header and events of the revision a stream is sending, shared by its watchers.
/// It holds one revision at a time: a watcher catching up from history sends older ones, and
/// those are encoded again when the live revision comes back.
#[derive(Default)]
pub struct FrameCache {
    revision: i64,
    header: Bytes,
    /// The hub's batch of the revision, and its events encoded whole: without and with the
    /// versions they replaced.
    batch: Option<Arc<RevisionBatch>>,
    whole: [Option<Bytes>; 2],
}

impl FrameCache {
    /// Moves to `revision`, forgetting the previous one's encodings.
    fn at(&mut self, revision: i64, header: impl FnOnce() -> pb::ResponseHeader) {
        if self.revision != revision || self.header.is_empty() {
            self.revision = revision;
            self.header = field(HEADER_FIELD, &header());
            self.batch = None;
            self.whole = [None, None];
        }
    }

    /// The response carrying all of `batch`'s events (with the versions they replaced when
    /// `prev_kv`) to watcher `watch_id`; `header` gives the revision's response header when
    /// the stream has not encoded it yet.
    pub fn shared(
        &mut self,
        header: impl FnOnce() -> pb::ResponseHeader,
        watch_id: i64,
        batch: &Arc<RevisionBatch>,
        prev_kv: bool,
    ) -> WatchFrame {
        self.at(batch.revision, header);
        if !self.batch.as_ref().is_some_and(|b| Arc::ptr_eq(b, batch)) {
            self.batch = Some(batch.clone());
            self.whole = [None, None];
        }
        let events = self.whole[usize::from(prev_kv)]
            .get_or_insert_with(|| {
                let mut buf = Vec::new();
                for e in &batch.events {
                    let mut e = e.clone();
                    if !prev_kv {
                        e.prev_kv = None;
                    }
                    prost::encoding::message::encode(EVENTS_FIELD, &event_to_pb(e), &mut buf);
                }
                buf.into()
            })
            .clone();
        WatchFrame::Events {
            header: self.header.clone(),
            watch_id,
            events,
        }
    }

    /// The response carrying `events` of `revision` to watcher `watch_id` (the part of a
    /// revision it wants, or one read from history), encoded for it alone; `header` gives the
    /// revision's response header when the stream has not encoded it yet.
    pub fn events(
        &mut self,
        header: impl FnOnce() -> pb::ResponseHeader,
        watch_id: i64,
        revision: i64,
        events: Vec<Event>,
    ) -> WatchFrame {
        self.at(revision, header);
        let mut buf = Vec::new();
        for e in events {
            prost::encoding::message::encode(EVENTS_FIELD, &event_to_pb(e), &mut buf);
        }
        WatchFrame::Events {
            header: self.header.clone(),
            watch_id,
            events: buf.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{EventKind, KeyValue};
    use crate::proto::mvccpb;

    fn kv(key: &str, value: &str, version: i64) -> KeyValue {
        KeyValue {
            key: Bytes::copy_from_slice(key.as_bytes()),
            create_revision: 3,
            mod_revision: 7,
            version,
            value: Bytes::copy_from_slice(value.as_bytes()),
            lease: 0,
        }
    }

    fn frame(header: pb::ResponseHeader, watch_id: i64, events: &[mvccpb::Event]) -> WatchFrame {
        WatchFrame::Events {
            header: field(HEADER_FIELD, &header),
            watch_id,
            events: events
                .iter()
                .flat_map(|e| field(EVENTS_FIELD, e).to_vec())
                .collect::<Vec<u8>>()
                .into(),
        }
    }

    /// A frame decodes as the WatchResponse prost writes for the same fields, byte for byte.
    #[test]
    fn a_frame_is_the_watch_response_prost_writes() {
        let header = pb::ResponseHeader {
            cluster_id: 11,
            member_id: 12,
            revision: 7,
            raft_term: 2,
        };
        let events: Vec<mvccpb::Event> = [
            Event {
                kind: EventKind::Put,
                kv: kv("a", "1", 2),
                prev_kv: Some(kv("a", "0", 1)),
            },
            Event {
                kind: EventKind::Delete,
                kv: kv("b", "", 0),
                prev_kv: None,
            },
        ]
        .into_iter()
        .map(event_to_pb)
        .collect();
        for (id, events) in [(5, &events[..]), (0, &events[..1]), (1 << 40, &[][..])] {
            let expected = pb::WatchResponse {
                header: Some(header),
                watch_id: id,
                events: events.to_vec(),
                ..Default::default()
            };
            let f = frame(header, id, events);
            let bytes = f.encode_to_vec();
            assert_eq!(bytes, expected.encode_to_vec(), "watch id {id}");
            assert_eq!(f.encoded_len(), bytes.len());
            assert_eq!(pb::WatchResponse::decode(&bytes[..]).unwrap(), expected);
        }
        let whole = pb::WatchResponse {
            header: Some(header),
            watch_id: 3,
            created: true,
            ..Default::default()
        };
        assert_eq!(
            pb::WatchResponse::decode(&WatchFrame::whole(&whole).encode_to_vec()[..]).unwrap(),
            whole
        );
        let mut f = WatchFrame::whole(&whole);
        assert!(
            f.merge(&b"\x08\x01"[..]).is_err(),
            "frames are never decoded"
        );
    }

    /// Watchers of one revision share its header, and a whole batch's encoded events; a
    /// watcher that asked for the previous version gets an encoding of its own, and the next
    /// revision encodes afresh.
    #[test]
    fn watchers_of_a_revision_share_its_encoded_events() {
        let header = |revision| pb::ResponseHeader {
            revision,
            ..Default::default()
        };
        let once = || -> pb::ResponseHeader { panic!("the header is encoded once") };
        let put = |prev: bool| Event {
            kind: EventKind::Put,
            kv: kv("a", "1", 2),
            prev_kv: prev.then(|| kv("a", "0", 1)),
        };
        let decoded = |f: &WatchFrame| pb::WatchResponse::decode(&f.encode_to_vec()[..]).unwrap();
        let parts = |f: &WatchFrame| match f {
            WatchFrame::Events { header, events, .. } => (header.clone(), events.clone()),
            WatchFrame::Whole(_) => panic!("an event frame"),
        };
        let mut cache = FrameCache::default();

        // Events looked up one by one.
        let a = cache.events(|| header(7), 1, 7, vec![put(false)]);
        let b = cache.events(once, 2, 7, vec![put(false)]);
        let c = cache.events(once, 3, 7, vec![put(true)]);
        let ((ha, ea), (hb, eb), (_, ec)) = (parts(&a), parts(&b), parts(&c));
        assert_eq!(ha.as_ptr(), hb.as_ptr());
        assert_eq!(ea, eb);
        assert_ne!(ea, ec, "the previous version is in c's event only");
        for (f, id, prev) in [(&a, 1, false), (&b, 2, false), (&c, 3, true)] {
            let expected = pb::WatchResponse {
                header: Some(header(7)),
                watch_id: id,
                events: vec![event_to_pb(put(prev))],
                ..Default::default()
            };
            assert_eq!(decoded(f), expected);
        }

        // A whole batch, encoded once for every watcher that wants it without previous
        // versions, and once for those that want them.
        let batch = Arc::new(RevisionBatch {
            revision: 8,
            events: vec![put(true), put(true)],
            restored: false,
        });
        let d = cache.shared(|| header(8), 1, &batch, false);
        let e = cache.shared(once, 2, &batch, false);
        let f = cache.shared(once, 3, &batch, true);
        assert_eq!(parts(&d).1.as_ptr(), parts(&e).1.as_ptr());
        for (frame, id, prev) in [(&d, 1, false), (&e, 2, false), (&f, 3, true)] {
            let expected = pb::WatchResponse {
                header: Some(header(8)),
                watch_id: id,
                events: vec![event_to_pb(put(prev)), event_to_pb(put(prev))],
                ..Default::default()
            };
            assert_eq!(decoded(frame), expected);
        }
    }
}
