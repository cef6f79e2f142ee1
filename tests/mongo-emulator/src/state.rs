//! The emulated data: databases, collections, unique indexes and the bounded oplog.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bson::{doc, Bson, DateTime, Document, Timestamp};
use flowwarden::matcher::{get_path, update::UpdateChanges};
use tokio::sync::watch;

use crate::error::CommandError;
use crate::txn::{PendingOp, TxnTag, Versions};

/// A canonical key for `_id` and unique-index values (numbers of equal value share a key).
pub(crate) fn value_key(v: &Bson) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    push_key(v, &mut out);
    out
}

fn push_key(v: &Bson, out: &mut Vec<u8>) {
    match v {
        Bson::Int32(n) => {
            out.push(b'n');
            out.extend_from_slice(&i64::from(*n).to_be_bytes());
        }
        Bson::Int64(n) => {
            out.push(b'n');
            out.extend_from_slice(&n.to_be_bytes());
        }
        #[allow(clippy::cast_possible_truncation)]
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => {
            out.push(b'n');
            out.extend_from_slice(&(*f as i64).to_be_bytes());
        }
        Bson::String(s) => {
            out.push(b's');
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        Bson::ObjectId(o) => {
            out.push(b'o');
            out.extend_from_slice(&o.bytes());
        }
        Bson::Array(items) => {
            out.push(b'[');
            for i in items {
                push_key(i, out);
            }
            out.push(b']');
        }
        Bson::Document(d) => {
            out.push(b'{');
            for (k, i) in d {
                out.extend_from_slice(k.as_bytes());
                out.push(0);
                push_key(i, out);
            }
            out.push(b'}');
        }
        other => {
            out.push(b'x');
            out.push(flowwarden::matcher::type_bracket(other));
            let _ = doc! {"v": other.clone()}.to_writer(&mut *out);
        }
    }
}

/// One index definition, as `listIndexes` reports it.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    pub(crate) name: String,
    pub(crate) key: Document,
    pub(crate) unique: bool,
    pub(crate) spec: Document,
}

impl Index {
    pub(crate) fn id_index() -> Index {
        Index {
            name: "_id_".into(),
            key: doc! {"_id": 1},
            unique: true,
            spec: doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"},
        }
    }

    pub(crate) fn key_of(&self, d: &Document) -> Bson {
        Bson::Array(
            self.key
                .keys()
                .map(|k| get_path(d, k).cloned().unwrap_or(Bson::Null))
                .collect(),
        )
    }

    pub(crate) fn key_value_doc(&self, d: &Document) -> Document {
        self.key
            .keys()
            .map(|k| (k.clone(), get_path(d, k).cloned().unwrap_or(Bson::Null)))
            .collect()
    }
}

/// One collection.
#[derive(Debug, Clone)]
pub(crate) struct Collection {
    /// Record id → document; record ids grow, so iteration is natural (insertion) order.
    pub(crate) docs: BTreeMap<u64, Arc<Document>>,
    pub(crate) by_id: HashMap<Vec<u8>, u64>,
    next_record: u64,
    pub(crate) indexes: Vec<Index>,
    /// `changeStreamPreAndPostImages.enabled`.
    pub(crate) images: bool,
}

impl Default for Collection {
    fn default() -> Self {
        Collection {
            docs: BTreeMap::new(),
            by_id: HashMap::new(),
            next_record: 0,
            indexes: vec![Index::id_index()],
            images: false,
        }
    }
}

impl Collection {
    /// Finds a unique-index violation that `doc` would cause (ignoring record `except`).
    pub(crate) fn unique_violation(&self, d: &Document, except: Option<u64>) -> Option<&Index> {
        for idx in self.indexes.iter().filter(|i| i.unique) {
            if idx.name == "_id_" {
                let id = d.get("_id").cloned().unwrap_or(Bson::Null);
                if let Some(rid) = self.by_id.get(&value_key(&id)) {
                    if Some(*rid) != except {
                        return Some(idx);
                    }
                }
                continue;
            }
            let key = value_key(&idx.key_of(d));
            let clash = self
                .docs
                .iter()
                .any(|(rid, other)| Some(*rid) != except && value_key(&idx.key_of(other)) == key);
            if clash {
                return Some(idx);
            }
        }
        None
    }

    pub(crate) fn insert_record(&mut self, d: Arc<Document>) -> u64 {
        self.next_record += 1;
        let rid = self.next_record;
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        self.by_id.insert(value_key(&id), rid);
        self.docs.insert(rid, d);
        rid
    }

    pub(crate) fn remove_record(&mut self, rid: u64) -> Option<Arc<Document>> {
        let d = self.docs.remove(&rid)?;
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        self.by_id.remove(&value_key(&id));
        Some(d)
    }

    pub(crate) fn get_by_id(&self, id: &Bson) -> Option<&Arc<Document>> {
        self.by_id
            .get(&value_key(id))
            .and_then(|rid| self.docs.get(rid))
    }
}

/// What an oplog entry records.
#[derive(Debug, Clone)]
pub(crate) enum OpKind {
    /// The set's initiation marker (never shown to streams).
    Noop,
    Insert {
        doc: Arc<Document>,
    },
    Update {
        id: Bson,
        changes: Arc<UpdateChanges>,
        post: Arc<Document>,
        pre: Option<Arc<Document>>,
    },
    Replace {
        id: Bson,
        post: Arc<Document>,
        pre: Option<Arc<Document>>,
    },
    Delete {
        id: Bson,
        pre: Option<Arc<Document>>,
    },
    Drop,
    Rename {
        to_db: String,
        to_coll: String,
    },
    DropDatabase,
}

/// One oplog entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) pos: u64,
    pub(crate) ts: Timestamp,
    pub(crate) wall: DateTime,
    pub(crate) db: String,
    pub(crate) coll: String,
    /// Whether the collection had pre- and post-images enabled at the time of the write.
    pub(crate) images: bool,
    pub(crate) kind: OpKind,
    /// The session and transaction number, for a write a transaction committed.
    pub(crate) txn: Option<Arc<TxnTag>>,
}

/// The kind byte at the end of a resume token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Event = 0,
    Invalidate = 1,
    HighWater = 2,
}

/// A decoded resume token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) ts: Timestamp,
    pub(crate) pos: u64,
    pub(crate) kind: TokenKind,
    /// Fragment number (from 1) of a split event; 0 for a whole event.
    pub(crate) fragment: u16,
}

const TOKEN_VERSION: &str = "82";
const TOKEN_LEN: usize = 2 + 8 + 8 + 16 + 2 + 4;

impl Token {
    /// The token of the event for `e`.
    pub(crate) fn event(e: &Entry) -> Token {
        Token {
            ts: e.ts,
            pos: e.pos,
            kind: TokenKind::Event,
            fragment: 0,
        }
    }

    /// The token of the invalidate that follows `e`.
    pub(crate) fn invalidate(e: &Entry) -> Token {
        Token {
            kind: TokenKind::Invalidate,
            ..Token::event(e)
        }
    }

    /// `{_data: "82" + time(8) + increment(8) + position(16) + kind(2) + fragment(4)}`,
    /// uppercase hex. Like a real server's token it starts with the type byte of a BSON
    /// timestamp and the entry's cluster time, big-endian, so a client decodes the time of
    /// any token (event or post-batch) the same way on both. Times grow with positions, so the
    /// string order is the oplog order: by position, then event (and its fragments, in order)
    /// < invalidate < high-water mark.
    pub(crate) fn to_document(self) -> Document {
        doc! {"_data": format!(
            "{TOKEN_VERSION}{:08X}{:08X}{:016X}{:02X}{:04X}",
            self.ts.time, self.ts.increment, self.pos, self.kind as u8, self.fragment
        )}
    }

    /// Decodes a token document; `Err` carries the parse error reply (9 FailedToParse).
    pub(crate) fn parse(token: &Bson) -> Result<Token, CommandError> {
        let bad = || {
            CommandError::failed_to_parse(format!(
                "resume token is not one this emulator issued: {token}"
            ))
        };
        let data = token
            .as_document()
            .and_then(|d| d.get_str("_data").ok())
            .ok_or_else(bad)?;
        if data.len() != TOKEN_LEN
            || !data.starts_with(TOKEN_VERSION)
            || !data
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
        {
            return Err(bad());
        }
        let hex = |r: std::ops::Range<usize>| {
            data.get(r)
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or_else(bad)
        };
        let time = u32::try_from(hex(2..10)?).map_err(|_| bad())?;
        let increment = u32::try_from(hex(10..18)?).map_err(|_| bad())?;
        let pos = hex(18..34)?;
        let kind = match hex(34..36)? {
            0 => TokenKind::Event,
            1 => TokenKind::Invalidate,
            2 => TokenKind::HighWater,
            _ => return Err(bad()),
        };
        let fragment = u16::try_from(hex(36..40)?).map_err(|_| bad())?;
        if fragment != 0 && kind != TokenKind::Event {
            return Err(bad());
        }
        Ok(Token {
            ts: Timestamp { time, increment },
            pos,
            kind,
            fragment,
        })
    }
}

/// All emulated state.
#[derive(Debug)]
pub(crate) struct Data {
    pub(crate) dbs: BTreeMap<String, BTreeMap<String, Collection>>,
    pub(crate) oplog: VecDeque<Entry>,
    pub(crate) capacity: usize,
    /// Position of the newest entry ever written (entries are numbered from 1).
    pub(crate) head_pos: u64,
    pub(crate) head_ts: Timestamp,
    /// Time of the newest entry dropped from the oplog (zero before any), for the high-water
    /// mark of a position that is no longer retained.
    pub(crate) dropped_ts: Timestamp,
    /// Added to the real clock to give the server's time (`$$NOW`, oplog times); moved by
    /// tests through `Emulator::advance_clock`.
    pub(crate) clock_offset_ms: i64,
    pub(crate) head_tx: watch::Sender<u64>,
    /// While a command runs inside a transaction: its writes, held back from the oplog.
    pub(crate) capture: Option<Vec<PendingOp>>,
    /// Document versions, kept while some transaction is open.
    pub(crate) versions: Option<Versions>,
}

impl Data {
    pub(crate) fn new(capacity: usize) -> Data {
        let (head_tx, _) = watch::channel(0);
        let mut d = Data {
            dbs: BTreeMap::new(),
            oplog: VecDeque::new(),
            capacity: capacity.max(1),
            head_pos: 0,
            head_ts: Timestamp {
                time: 0,
                increment: 0,
            },
            dropped_ts: Timestamp {
                time: 0,
                increment: 0,
            },
            clock_offset_ms: 0,
            head_tx,
            capture: None,
            versions: None,
        };
        d.log(String::new(), String::new(), false, OpKind::Noop);
        d.publish();
        d
    }

    /// Position of the oldest retained entry (`head_pos + 1` when the oplog is empty).
    pub(crate) fn first_pos(&self) -> u64 {
        self.oplog.front().map_or(self.head_pos + 1, |e| e.pos)
    }

    pub(crate) fn entry(&self, pos: u64) -> Option<&Entry> {
        let first = self.first_pos();
        let idx = usize::try_from(pos.checked_sub(first)?).ok()?;
        self.oplog.get(idx)
    }

    /// The server's time: the real clock plus the test-controlled offset.
    pub(crate) fn now(&self) -> DateTime {
        DateTime::from_millis(
            DateTime::now()
                .timestamp_millis()
                .saturating_add(self.clock_offset_ms),
        )
    }

    fn next_ts(&self) -> Timestamp {
        let now = self.now().timestamp_millis() / 1000;
        let now = u32::try_from(now).unwrap_or(u32::MAX);
        if now > self.head_ts.time {
            Timestamp {
                time: now,
                increment: 1,
            }
        } else {
            Timestamp {
                time: self.head_ts.time,
                increment: self.head_ts.increment.saturating_add(1),
            }
        }
    }

    /// Appends an entry (waiters are woken by [`Data::publish`]); inside a transaction, holds
    /// the write back in [`Data::capture`] instead.
    pub(crate) fn log(
        &mut self,
        db: String,
        coll: String,
        images: bool,
        kind: OpKind,
    ) -> Timestamp {
        let op = PendingOp {
            db,
            coll,
            images,
            kind,
        };
        if let Some(held) = self.capture.as_mut() {
            held.push(op);
            return self.head_ts;
        }
        let ts = self.next_ts();
        self.append(ts, op, None);
        ts
    }

    /// Appends the writes of a committed transaction: consecutive entries sharing one cluster
    /// time (the commit's), each tagged with the session.
    pub(crate) fn log_batch(&mut self, ops: Vec<PendingOp>, tag: &Arc<TxnTag>) -> Timestamp {
        let ts = self.next_ts();
        for op in ops {
            self.append(ts, op, Some(tag.clone()));
        }
        ts
    }

    fn append(&mut self, ts: Timestamp, op: PendingOp, txn: Option<Arc<TxnTag>>) {
        self.head_pos += 1;
        self.head_ts = ts;
        if let Some(v) = self.versions.as_mut() {
            v.record(&op, self.head_pos);
        }
        self.oplog.push_back(Entry {
            pos: self.head_pos,
            ts,
            wall: self.now(),
            db: op.db,
            coll: op.coll,
            images: op.images,
            kind: op.kind,
            txn,
        });
        while self.oplog.len() > self.capacity {
            self.drop_oldest();
        }
    }

    /// Wakes change-stream `getMore`s waiting for new entries.
    pub(crate) fn publish(&self) {
        if *self.head_tx.borrow() != self.head_pos {
            self.head_tx.send_replace(self.head_pos);
        }
    }

    /// Drops entries older than `first` (keeps positions `>= first`).
    pub(crate) fn truncate_before(&mut self, first: u64) {
        // Like a capped oplog, the newest entry always stays.
        let first = first.min(self.head_pos);
        while self.oplog.front().is_some_and(|e| e.pos < first) {
            self.drop_oldest();
        }
    }

    fn drop_oldest(&mut self) {
        if let Some(e) = self.oplog.pop_front() {
            self.dropped_ts = e.ts;
        }
    }

    pub(crate) fn coll(&self, db: &str, coll: &str) -> Option<&Collection> {
        self.dbs.get(db)?.get(coll)
    }

    pub(crate) fn coll_mut(&mut self, db: &str, coll: &str) -> Option<&mut Collection> {
        self.dbs.get_mut(db)?.get_mut(coll)
    }

    pub(crate) fn coll_or_create(&mut self, db: &str, coll: &str) -> &mut Collection {
        self.dbs
            .entry(db.to_string())
            .or_default()
            .entry(coll.to_string())
            .or_default()
    }

    /// The token for "just after position `pos`" with the timestamp of that entry (of the
    /// newest dropped one when `pos` is no longer retained, so tokens keep the oplog order).
    pub(crate) fn high_water(&self, pos: u64) -> Token {
        let ts = match self.entry(pos) {
            Some(e) => e.ts,
            None if pos < self.first_pos() => self.dropped_ts,
            None => self.head_ts,
        };
        Token {
            ts,
            pos,
            kind: TokenKind::HighWater,
            fragment: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_sort_by_position() {
        let ts = |increment| Timestamp { time: 9, increment };
        let a = Token {
            ts: ts(1),
            pos: 15,
            kind: TokenKind::Event,
            fragment: 0,
        };
        let b = Token {
            ts: ts(2),
            pos: 16,
            kind: TokenKind::Event,
            fragment: 0,
        };
        let hw = Token {
            kind: TokenKind::HighWater,
            ..a
        };
        let inv = Token {
            kind: TokenKind::Invalidate,
            ..a
        };
        let f1 = Token { fragment: 1, ..a };
        let f2 = Token { fragment: 2, ..a };
        let s = |t: Token| {
            t.to_document()
                .get_str("_data")
                .expect("string")
                .to_string()
        };
        let ordered = [s(a), s(f1), s(f2), s(inv), s(hw), s(b)];
        assert!(ordered.windows(2).all(|w| w[0] < w[1]), "{ordered:?}");
        assert_eq!(s(a), s(a).to_uppercase());
        for t in [a, b, hw, inv, f1, f2] {
            assert_eq!(
                Token::parse(&Bson::Document(t.to_document())).expect("parses"),
                t
            );
        }
        assert_eq!(
            Token::parse(&Bson::Document(doc! {"_data": "zz"})).map_err(|e| e.code),
            Err(9)
        );
        let lower = s(a).to_lowercase();
        assert!(Token::parse(&Bson::Document(doc! {"_data": lower})).is_err());
        assert!(Token::parse(&Bson::Int32(1)).is_err());
    }

    #[test]
    fn oplog_is_bounded_and_positions_are_contiguous() {
        let mut d = Data::new(3);
        for _ in 0..5 {
            d.log("db".into(), "c".into(), false, OpKind::Drop);
        }
        assert_eq!(d.head_pos, 6);
        assert_eq!(d.first_pos(), 4);
        assert!(d.entry(3).is_none());
        assert_eq!(d.entry(5).map(|e| e.pos), Some(5));
        d.truncate_before(6);
        assert_eq!(d.first_pos(), 6);
    }

    #[test]
    fn tokens_carry_the_cluster_time_where_a_real_server_puts_it() {
        let mut d = Data::new(3);
        for _ in 0..5 {
            d.log("db".into(), "c".into(), false, OpKind::Drop);
        }
        let decode =
            |t: Token| flowwarden::ResumeToken::from_document(t.to_document()).cluster_time();
        let (pos, ts) = d.oplog.back().map(|e| (e.pos, e.ts)).expect("an entry");
        let event = d.entry(pos).map(Token::event).expect("retained");
        assert_eq!(decode(event), Some(ts));
        assert_eq!(decode(d.high_water(pos)), Some(ts));
        // The high-water mark of a dropped position keeps the oplog order: it sorts before
        // every retained entry's token, never after them.
        let s = |t: Token| t.to_document().get_str("_data").expect("string").to_owned();
        let dropped = d.high_water(d.first_pos() - 1);
        let first = d.entry(d.first_pos()).map(Token::event).expect("retained");
        assert!(s(dropped) < s(first), "{} !< {}", s(dropped), s(first));
    }

    #[test]
    fn numbers_share_id_keys() {
        assert_eq!(value_key(&Bson::Int32(1)), value_key(&Bson::Double(1.0)));
        assert_ne!(
            value_key(&Bson::Int32(1)),
            value_key(&Bson::String("1".into()))
        );
    }
}
