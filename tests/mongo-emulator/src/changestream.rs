//! Change streams: opening (`aggregate` with `$changeStream`), reading the oplog into change
//! events ("Change Events" in the manual), resume tokens and invalidation.

use std::collections::VecDeque;

use bson::{doc, Bson, Document, RawDocumentBuf, Timestamp};
use flowwarden::matcher::pipeline::EventPipeline;

use crate::error::CommandError;
use crate::state::{Data, Entry, OpKind, Token, TokenKind};

/// Largest BSON document, as announced in `hello`.
pub(crate) const MAX_BSON: usize = 16 * 1024 * 1024;

/// What a stream watches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scope {
    Cluster,
    Db(String),
    Coll(String, String),
}

const INTERNAL_DBS: [&str; 3] = ["admin", "config", "local"];

impl Scope {
    fn covers(&self, e: &Entry) -> bool {
        if matches!(e.kind, OpKind::Noop) {
            return false;
        }
        match self {
            Scope::Cluster => !INTERNAL_DBS.contains(&e.db.as_str()),
            Scope::Db(db) => &e.db == db,
            Scope::Coll(db, coll) => {
                &e.db == db && &e.coll == coll && !matches!(e.kind, OpKind::DropDatabase)
            }
        }
    }

    fn invalidated_by(&self, e: &Entry) -> bool {
        match self {
            Scope::Cluster => false,
            Scope::Db(db) => &e.db == db && matches!(e.kind, OpKind::DropDatabase),
            Scope::Coll(db, coll) => {
                &e.db == db
                    && &e.coll == coll
                    && matches!(e.kind, OpKind::Drop | OpKind::Rename { .. })
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum FullDocument {
    Default,
    UpdateLookup,
    WhenAvailable,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum BeforeChange {
    Off,
    WhenAvailable,
    Required,
}

/// An open change stream cursor.
#[derive(Debug)]
pub(crate) struct ChangeCursor {
    pub(crate) ns: String,
    scope: Scope,
    /// Next oplog position to read.
    next_pos: u64,
    pipeline: EventPipeline,
    full_document: FullDocument,
    before_change: BeforeChange,
    pending_invalidate: Option<Token>,
    /// Fragments of a split event not handed out yet, with their tokens.
    pending_fragments: VecDeque<(RawDocumentBuf, Document)>,
    /// When resuming from a fragment token: (position, fragments already delivered).
    skip_fragments: Option<(u64, u16)>,
    /// Set once the invalidate event has been handed out: the cursor is then exhausted.
    pub(crate) closed: bool,
    /// The post-batch resume token of the last batch.
    pub(crate) pbrt: Document,
}

/// One batch read from the oplog.
pub(crate) struct Batch {
    pub(crate) events: Vec<RawDocumentBuf>,
}

fn invalid_option(field: &str) -> CommandError {
    CommandError::new(
        40415,
        "Location40415",
        format!("BSON field '$changeStream.{field}' is an unknown field."),
    )
}

impl ChangeCursor {
    /// Moves the start of a cursor opened at "now" back to right after `pos` (never before
    /// the oldest retained entry): the later writes count as committed after the open's start.
    pub(crate) fn start_after(&mut self, data: &Data, pos: u64) {
        self.next_pos = (pos + 1).clamp(data.first_pos(), self.next_pos);
        self.pbrt = data.high_water(self.next_pos - 1).to_document();
    }

    /// Validates the `$changeStream` stage and the stages after it and positions the cursor.
    pub(crate) fn open(
        data: &Data,
        scope: Scope,
        ns: String,
        spec: &Document,
        rest: &[Document],
    ) -> Result<ChangeCursor, CommandError> {
        let mut full_document = FullDocument::Default;
        let mut before_change = BeforeChange::Off;
        let mut resume_after = None;
        let mut start_after = None;
        let mut start_at = None;
        for (key, value) in spec {
            match key.as_str() {
                "fullDocument" => {
                    full_document = match value.as_str() {
                        Some("default") => FullDocument::Default,
                        Some("updateLookup") => FullDocument::UpdateLookup,
                        Some("whenAvailable") => FullDocument::WhenAvailable,
                        Some("required") => FullDocument::Required,
                        _ => {
                            return Err(CommandError::bad_value(format!(
                                "'{value}' is not a valid value for $changeStream.fullDocument"
                            )))
                        }
                    }
                }
                "fullDocumentBeforeChange" => {
                    before_change = match value.as_str() {
                        Some("off") => BeforeChange::Off,
                        Some("whenAvailable") => BeforeChange::WhenAvailable,
                        Some("required") => BeforeChange::Required,
                        _ => {
                            return Err(CommandError::bad_value(format!(
                                "'{value}' is not a valid value for $changeStream.fullDocumentBeforeChange"
                            )))
                        }
                    }
                }
                "resumeAfter" => resume_after = Some(value),
                "startAfter" => start_after = Some(value),
                "startAtOperationTime" => match value {
                    Bson::Timestamp(ts) => start_at = Some(*ts),
                    _ => {
                        return Err(CommandError::type_mismatch(
                            "BSON field '$changeStream.startAtOperationTime' is the wrong type, expected type 'timestamp'",
                        ))
                    }
                },
                "allChangesForCluster" => {
                    let on = value.as_bool().unwrap_or(false);
                    if on != (scope == Scope::Cluster) {
                        return Err(CommandError::new(
                            73,
                            "InvalidNamespace",
                            "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, and with no collection name",
                        ));
                    }
                }
                "showExpandedEvents" | "allowToRunOnConfigDB" | "allowToRunOnSystemNS" => {}
                other => return Err(invalid_option(other)),
            }
        }
        if [
            resume_after.is_some(),
            start_after.is_some(),
            start_at.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count()
            > 1
        {
            return Err(CommandError::new(
                40674,
                "Location40674",
                "Only one type of resume option is allowed, but multiple were found.",
            ));
        }
        let pipeline = EventPipeline::parse(rest)?;
        let mut cursor = ChangeCursor {
            ns,
            scope,
            next_pos: data.head_pos + 1,
            pipeline,
            full_document,
            before_change,
            pending_invalidate: None,
            pending_fragments: VecDeque::new(),
            skip_fragments: None,
            closed: false,
            pbrt: data.high_water(data.head_pos).to_document(),
        };
        if let Some(token) = resume_after.or(start_after) {
            let t = Token::parse(token)?;
            if t.kind == TokenKind::Invalidate && resume_after.is_some() {
                return Err(CommandError::invalid_resume_token(
                    "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.",
                ));
            }
            if t.pos > data.head_pos {
                return Err(CommandError::invalid_resume_token(
                    "The resume token is ahead of this emulator's oplog: it was not issued by this emulator instance.",
                ));
            }
            if t.pos < data.first_pos() {
                return Err(CommandError::history_lost());
            }
            let entry = data.entry(t.pos);
            if entry.is_some_and(|e| e.ts != t.ts) {
                return Err(CommandError::invalid_resume_token(
                    "The resume token does not match this emulator's oplog: it was not issued by this emulator instance.",
                ));
            }
            cursor.next_pos = t.pos + 1;
            cursor.pbrt = token.as_document().cloned().unwrap_or_default();
            if t.fragment > 0 {
                // Resuming from a fragment: re-read that event and hand out the rest of it.
                cursor.next_pos = t.pos;
                cursor.skip_fragments = Some((t.pos, t.fragment));
            } else if t.kind == TokenKind::Event {
                if let Some(e) = entry.filter(|e| cursor.scope.invalidated_by(e)) {
                    cursor.pending_invalidate = Some(Token::invalidate(e));
                }
            }
        } else if let Some(ts) = start_at {
            let oldest = data.oplog.front().map_or(data.head_ts, |e| e.ts);
            if ts_lt(ts, oldest) || data.oplog.is_empty() {
                return Err(CommandError::history_lost());
            }
            let idx = data.oplog.partition_point(|e| ts_lt(e.ts, ts));
            cursor.next_pos = data.first_pos() + idx as u64;
            let before = cursor.next_pos - 1;
            let mut hw = data.high_water(before);
            if data.entry(before).is_none() {
                hw.ts = ts;
            }
            cursor.pbrt = hw.to_document();
        }
        Ok(cursor)
    }

    /// Reads up to `max_events` events (and at most about 16 MB) from the oplog.
    pub(crate) fn read(&mut self, data: &Data, max_events: usize) -> Result<Batch, CommandError> {
        let mut events = Vec::new();
        let mut bytes = 0usize;
        loop {
            if self.closed || events.len() >= max_events {
                return Ok(Batch { events });
            }
            if let Some((raw, _)) = self.pending_fragments.front() {
                let len = raw.as_bytes().len();
                if !events.is_empty() && bytes + len > MAX_BSON {
                    return Ok(Batch { events });
                }
                if let Some((raw, token)) = self.pending_fragments.pop_front() {
                    bytes += len;
                    events.push(raw);
                    self.pbrt = token;
                }
                continue;
            }
            if let Some(inv) = self.pending_invalidate.take() {
                // Like the server: the invalidate goes through the user's pipeline too, and the
                // cursor closes either way, its post-batch token the invalidate's.
                let event = invalidate_event(inv, data);
                let event = if self.pipeline.is_empty() {
                    Some(event)
                } else {
                    self.pipeline.apply(event)
                };
                if let Some(event) = event {
                    events.push(encode(&event)?);
                }
                self.pbrt = inv.to_document();
                self.closed = true;
                continue;
            }
            if self.next_pos < data.first_pos() {
                return Err(CommandError::history_lost());
            }
            if self.next_pos > data.head_pos {
                return Ok(Batch { events });
            }
            let Some(entry) = data.entry(self.next_pos) else {
                return Err(CommandError::history_lost());
            };
            let skip = match self.skip_fragments.take() {
                Some((pos, n)) if pos == entry.pos => Some(n),
                _ => None,
            };
            if !self.scope.covers(entry) {
                self.pbrt = data.high_water(entry.pos).to_document();
                self.next_pos += 1;
                continue;
            }
            let token = Token::event(entry).to_document();
            let event = self.build_event(entry, token.clone(), data)?;
            let event = if self.pipeline.is_empty() {
                Some(event)
            } else {
                self.pipeline.apply(event)
            };
            let Some(event) = event else {
                self.pbrt = data.high_water(entry.pos).to_document();
                self.next_pos += 1;
                if self.scope.invalidated_by(entry) {
                    // A filtered-out drop or rename still invalidates the stream.
                    self.pending_invalidate = Some(Token::invalidate(entry));
                }
                continue;
            };
            if event.get_document("_id").ok() != Some(&token) {
                return Err(CommandError::new(
                    280,
                    "ChangeStreamFatalError",
                    "Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. Modifying the _id field of an event makes it impossible to resume the stream from that point. Only transformations that retain the unmodified _id field are allowed.",
                ));
            }
            let raw = encode(&event)?;
            let len = raw.as_bytes().len();
            if len > MAX_BSON {
                if !self.pipeline.splits_large_events() {
                    return Err(too_large(len));
                }
                let fragments = split_event(&event, entry)?;
                let done = usize::from(skip.unwrap_or(0));
                self.pending_fragments
                    .extend(fragments.into_iter().skip(done));
            } else if skip.is_none() {
                if !events.is_empty() && bytes + len > MAX_BSON {
                    return Ok(Batch { events });
                }
                bytes += len;
                events.push(raw);
                self.pbrt = token;
            }
            self.next_pos += 1;
            if self.scope.invalidated_by(entry) {
                self.pending_invalidate = Some(Token::invalidate(entry));
            }
        }
    }

    fn build_event(
        &self,
        e: &Entry,
        token: Document,
        data: &Data,
    ) -> Result<Document, CommandError> {
        let op = match &e.kind {
            OpKind::Noop => "noop",
            OpKind::Insert { .. } => "insert",
            OpKind::Update { .. } => "update",
            OpKind::Replace { .. } => "replace",
            OpKind::Delete { .. } => "delete",
            OpKind::Drop => "drop",
            OpKind::Rename { .. } => "rename",
            OpKind::DropDatabase => "dropDatabase",
        };
        let mut ev = doc! {
            "_id": token,
            "operationType": op,
            "clusterTime": e.ts,
            "wallTime": e.wall,
        };
        let ns = if matches!(e.kind, OpKind::DropDatabase) {
            doc! {"db": e.db.clone()}
        } else {
            doc! {"db": e.db.clone(), "coll": e.coll.clone()}
        };
        let missing = |what: &str| {
            CommandError::new(
                47,
                "NoMatchingDocument",
                format!(
                    "Change stream was configured to require a {what} for all update, delete and replace events, but the {what} was not found for event: {{ts: {}, pos: {}}}",
                    ts_string(e.ts),
                    e.pos
                ),
            )
        };
        match &e.kind {
            OpKind::Insert { doc } => {
                ev.insert("fullDocument", (**doc).clone());
                ev.insert("ns", ns);
                ev.insert(
                    "documentKey",
                    doc! {"_id": doc.get("_id").cloned().unwrap_or(Bson::Null)},
                );
            }
            OpKind::Update {
                id, changes, post, ..
            } => {
                match self.full_document {
                    FullDocument::Default => {}
                    FullDocument::UpdateLookup => {
                        let current = data
                            .coll(&e.db, &e.coll)
                            .and_then(|c| c.get_by_id(id))
                            .map_or(Bson::Null, |d| Bson::Document((**d).clone()));
                        ev.insert("fullDocument", current);
                    }
                    FullDocument::WhenAvailable | FullDocument::Required => {
                        if e.images {
                            ev.insert("fullDocument", (**post).clone());
                        } else if self.full_document == FullDocument::Required {
                            return Err(missing("post-image"));
                        } else {
                            ev.insert("fullDocument", Bson::Null);
                        }
                    }
                }
                ev.insert("ns", ns);
                ev.insert("documentKey", doc! {"_id": id.clone()});
                ev.insert(
                    "updateDescription",
                    doc! {
                        "updatedFields": changes.updated_fields.clone(),
                        "removedFields": changes.removed_fields.iter().cloned().map(Bson::String).collect::<Vec<_>>(),
                        "truncatedArrays": [],
                    },
                );
            }
            OpKind::Replace { id, post, .. } => {
                ev.insert("fullDocument", (**post).clone());
                ev.insert("ns", ns);
                ev.insert("documentKey", doc! {"_id": id.clone()});
            }
            OpKind::Delete { id, .. } => {
                ev.insert("ns", ns);
                ev.insert("documentKey", doc! {"_id": id.clone()});
            }
            OpKind::Rename { to_db, to_coll } => {
                ev.insert("ns", ns);
                ev.insert("to", doc! {"db": to_db.clone(), "coll": to_coll.clone()});
            }
            OpKind::Drop | OpKind::DropDatabase | OpKind::Noop => {
                ev.insert("ns", ns);
            }
        }
        if let OpKind::Update { pre, .. }
        | OpKind::Replace { pre, .. }
        | OpKind::Delete { pre, .. } = &e.kind
        {
            match self.before_change {
                BeforeChange::Off => {}
                BeforeChange::WhenAvailable | BeforeChange::Required => match pre {
                    Some(p) if e.images => {
                        ev.insert("fullDocumentBeforeChange", (**p).clone());
                    }
                    _ if self.before_change == BeforeChange::Required => {
                        return Err(missing("pre-image"));
                    }
                    _ => {
                        ev.insert("fullDocumentBeforeChange", Bson::Null);
                    }
                },
            }
        }
        if let Some(tag) = &e.txn {
            ev.insert("lsid", tag.lsid.clone());
            ev.insert("txnNumber", tag.txn_number);
        }
        Ok(ev)
    }
}

fn too_large(len: usize) -> CommandError {
    CommandError::new(
        10334,
        "BSONObjectTooLarge",
        format!(
            "Executor error during getMore :: caused by :: BSONObj size: {len} (0x{len:X}) is invalid. Size must be between 0 and 16793600(16MB)"
        ),
    )
}

/// Splits an event over 16 MB into fragments of whole top-level fields, each with its own
/// token and `splitEvent: {fragment, of}` ("Large Change Stream Events" in the manual).
fn split_event(
    event: &Document,
    entry: &Entry,
) -> Result<Vec<(RawDocumentBuf, Document)>, CommandError> {
    const OVERHEAD: usize = 1024;
    let mut groups: Vec<Vec<(&String, &Bson)>> = vec![Vec::new()];
    let mut size = OVERHEAD;
    for (key, value) in event.iter().filter(|(k, _)| k.as_str() != "_id") {
        let field = encode(&doc! {key.clone(): value.clone()})?.as_bytes().len();
        if field + OVERHEAD > MAX_BSON {
            return Err(too_large(field));
        }
        if size + field > MAX_BSON {
            groups.push(Vec::new());
            size = OVERHEAD;
        }
        size += field;
        if let Some(last) = groups.last_mut() {
            last.push((key, value));
        }
    }
    let of = i32::try_from(groups.len()).unwrap_or(i32::MAX);
    let mut out = Vec::with_capacity(groups.len());
    for (i, fields) in groups.into_iter().enumerate() {
        let n = u16::try_from(i + 1).unwrap_or(u16::MAX);
        let token = Token {
            fragment: n,
            ..Token::event(entry)
        }
        .to_document();
        let mut d = doc! {"_id": token.clone(), "splitEvent": {"fragment": i32::from(n), "of": of}};
        for (k, v) in fields {
            d.insert(k.clone(), v.clone());
        }
        out.push((encode(&d)?, token));
    }
    Ok(out)
}

fn invalidate_event(token: Token, data: &Data) -> Document {
    let wall = data
        .entry(token.pos)
        .map_or_else(bson::DateTime::now, |e| e.wall);
    doc! {
        "_id": token.to_document(),
        "operationType": "invalidate",
        "clusterTime": token.ts,
        "wallTime": wall,
    }
}

fn encode(d: &Document) -> Result<RawDocumentBuf, CommandError> {
    RawDocumentBuf::from_document(d).map_err(|e| {
        CommandError::new(
            10334,
            "BSONObjectTooLarge",
            format!("cannot encode event: {e}"),
        )
    })
}

pub(crate) fn ts_lt(a: Timestamp, b: Timestamp) -> bool {
    (a.time, a.increment) < (b.time, b.increment)
}

fn ts_string(ts: Timestamp) -> String {
    format!("Timestamp({}, {})", ts.time, ts.increment)
}
