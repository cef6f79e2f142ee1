//! What a command reports, rendered as text for people or as one JSON document for scripts.

use std::fmt::Write as _;

use flowwarden::port::{DeadLetterRecord, DeadLetterStatus};
use serde_json::{json, Value};

use super::views::{
    date, extjson, CheckpointView, LeaseView, PositionView, RecordView, ResetReport,
};

/// What a command found or did: [`Report::to_text`] for a terminal, [`Report::to_json`] for
/// `--json`.
#[derive(Debug, Clone)]
pub struct Report {
    kind: Kind,
}

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Streams {
        database: String,
        server_time: String,
        streams: Vec<CheckpointView>,
    },
    Checkpoint(Box<CheckpointView>),
    Reset(Box<ResetReport>),
    DeadLetters(Vec<DeadLetterRecord>),
    DeadLetter(Box<DeadLetterRecord>),
    Discarded {
        id: String,
        stream: String,
        previous: DeadLetterStatus,
    },
    Replayed {
        id: String,
        admin: String,
    },
    Leases {
        name: String,
        server_time: String,
        leases: Vec<LeaseView>,
    },
    Released {
        lease: LeaseView,
        released: bool,
        forced: bool,
    },
}

impl From<Kind> for Report {
    fn from(kind: Kind) -> Report {
        Report { kind }
    }
}

/// One JSON document and a newline.
pub(crate) fn json_line(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    s.push('\n');
    s
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

impl Report {
    /// The machine-readable form (the `--json` output), documented in `docs/operations.md`.
    pub fn to_json(&self) -> Value {
        match &self.kind {
            Kind::Streams {
                database,
                server_time,
                streams,
            } => {
                json!({ "database": database, "server_time": server_time, "streams": to_value(streams) })
            }
            Kind::Checkpoint(v) => to_value(v),
            Kind::Reset(r) => r.to_json(),
            Kind::DeadLetters(records) => json!({
                "dead_letters": records.iter().map(|r| to_value(&RecordView::of(r))).collect::<Vec<_>>()
            }),
            Kind::DeadLetter(r) => to_value(&RecordView::of(r)),
            Kind::Discarded {
                id,
                stream,
                previous,
            } => json!({
                "id": id, "stream": stream, "previous_status": previous.as_str(),
                "status": DeadLetterStatus::Discarded.as_str(),
            }),
            Kind::Replayed { id, admin } => json!({
                "id": id, "status": DeadLetterStatus::Replayed.as_str(), "admin": admin,
            }),
            Kind::Leases {
                name,
                server_time,
                leases,
            } => json!({ "name": name, "server_time": server_time, "leases": to_value(leases) }),
            Kind::Released {
                lease,
                released,
                forced,
            } => {
                json!({ "name": lease.name, "released": released, "forced": forced, "lease": to_value(lease) })
            }
        }
    }

    /// The form for people.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        match &self.kind {
            Kind::Streams {
                database,
                server_time,
                streams,
            } => {
                let _ = writeln!(
                    out,
                    "{} stream(s) in database {database} (server time {server_time})",
                    streams.len()
                );
                for s in streams {
                    out.push('\n');
                    stream_text(&mut out, s);
                }
            }
            Kind::Checkpoint(v) => stream_text(&mut out, v),
            Kind::Reset(r) => reset_text(&mut out, r),
            Kind::DeadLetters(records) => {
                let _ = writeln!(out, "{} dead letter(s), oldest first", records.len());
                for r in records {
                    let _ = writeln!(
                        out,
                        "{}  {}  {}  {}  {} attempt(s), first failed {}: {}",
                        r.id,
                        r.stream,
                        r.status.as_str(),
                        r.operation_type,
                        r.attempts,
                        date(r.first_failed_at),
                        r.error_chain.first().map(String::as_str).unwrap_or("")
                    );
                }
            }
            Kind::DeadLetter(r) => record_text(&mut out, r),
            Kind::Discarded {
                id,
                stream,
                previous,
            } => {
                let _ = writeln!(
                    out,
                    "dead letter {id} of stream '{stream}': {} -> discarded (kept for audit)",
                    previous.as_str()
                );
            }
            Kind::Replayed { id, admin } => {
                let _ = writeln!(
                    out,
                    "dead letter {id} replayed through the service at {admin}: its handler succeeded; status replayed"
                );
            }
            Kind::Leases {
                name,
                server_time,
                leases,
            } => {
                let _ = writeln!(out, "leases of '{name}' (server time {server_time}):");
                for l in leases {
                    lease_text(&mut out, l);
                }
            }
            Kind::Released {
                lease,
                released,
                forced,
            } => {
                if *released {
                    let _ = writeln!(
                        out,
                        "lease '{}' released{}: it was {} by '{}' (epoch {}); it is free now, the epoch is kept (the next holder gets epoch {})",
                        lease.name,
                        if *forced { " (forced)" } else { "" },
                        if lease.held { "held" } else { "expired, last held" },
                        lease.owner.as_deref().unwrap_or("?"),
                        lease.epoch.unwrap_or_default(),
                        lease.epoch.unwrap_or_default() + 1
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "lease '{}' is already free (expired {}); nothing changed",
                        lease.name,
                        lease.expires_at.as_deref().unwrap_or("?")
                    );
                }
            }
        }
        out
    }
}

fn position_text(out: &mut String, label: &str, p: Option<&PositionView>) {
    let Some(p) = p else {
        let _ = writeln!(out, "    {label}: none");
        return;
    };
    let _ = write!(out, "    {label}: {}", p.token);
    if let Some(ct) = &p.cluster_time {
        let _ = write!(out, "  cluster time {}.{} ({})", ct.t, ct.i, ct.time);
    }
    if let Some(w) = &p.wall_time {
        let _ = write!(out, "  wall time {w}");
    }
    if p.start_after {
        out.push_str("  (startAfter: an invalidate's token)");
    }
    out.push('\n');
}

fn lease_text(out: &mut String, l: &LeaseView) {
    if let Some(e) = &l.error {
        let _ = writeln!(out, "  {} '{}': CORRUPT: {e}", l.kind, l.name);
        return;
    }
    let when = match l.expires_in_secs {
        Some(s) if s >= 0 => format!("in {s} s"),
        Some(s) => format!("{} s ago", -s),
        None => "?".into(),
    };
    let _ = writeln!(
        out,
        "  {} lease '{}': {} by '{}', epoch {}, expires {} ({when})",
        l.kind,
        l.name,
        if l.held { "HELD" } else { "free (expired)" },
        l.owner.as_deref().unwrap_or("?"),
        l.epoch.unwrap_or_default(),
        l.expires_at.as_deref().unwrap_or("?"),
    );
}

fn stream_text(out: &mut String, s: &CheckpointView) {
    let state = if s.running {
        format!("RUNNING ({})", s.running_evidence.join("; "))
    } else {
        "no sign of running".to_owned()
    };
    let _ = writeln!(out, "{}: {state}", s.name);
    let c = &s.checkpoint;
    let saved = match (&c.saved_at, c.saved_secs_ago) {
        (Some(at), Some(ago)) => format!(", saved {at} ({ago} s ago)"),
        _ => String::new(),
    };
    let by = c
        .owner
        .as_ref()
        .map(|o| format!(" by '{o}'"))
        .unwrap_or_default();
    let epoch = c.epoch.map(|e| format!(", epoch {e}")).unwrap_or_default();
    let _ = writeln!(out, "  checkpoint: {}{saved}{by}{epoch}", c.state);
    if let Some(e) = &c.error {
        let _ = writeln!(out, "    {e}");
    }
    if c.state == "sound" {
        position_text(out, "lastProcessed", c.last_processed.as_ref());
        position_text(out, "lastSeen     ", c.last_seen.as_ref());
    }
    if s.leases.is_empty() {
        let _ = writeln!(out, "  leases: none");
    }
    for l in &s.leases {
        lease_text(out, l);
    }
    let d = &s.dead_letters;
    let _ = writeln!(
        out,
        "  dead letters: {} pending, {} replayed, {} discarded",
        d.pending, d.replayed, d.discarded
    );
}

fn reset_text(out: &mut String, r: &ResetReport) {
    let _ = writeln!(
        out,
        "checkpoint of '{}' reset (to {}{}):",
        r.stream,
        r.mode,
        if r.forced { ", forced" } else { "" }
    );
    match (&r.old_view, &r.old) {
        (Some(v), _) => {
            out.push_str("  old:\n");
            position_text(out, "lastProcessed", v.last_processed.as_ref());
            position_text(out, "lastSeen     ", v.last_seen.as_ref());
        }
        (None, Some(raw)) => {
            let _ = writeln!(out, "  old document: {}", extjson(raw.clone()));
        }
        (None, None) => out.push_str("  old: no checkpoint\n"),
    }
    out.push_str("  new (both positions):\n");
    position_text(out, "position     ", Some(&PositionView::of(&r.new)));
    let _ = writeln!(out, "  the stream resumes {}", r.resumes);
    for g in &r.gaps {
        let _ = writeln!(out, "  gap against {}: {}", g.from, g.message);
    }
    for n in &r.notes {
        let _ = writeln!(out, "  note: {n}");
    }
}

fn record_text(out: &mut String, r: &DeadLetterRecord) {
    let v = RecordView::of(r);
    let _ = writeln!(out, "dead letter {}", v.id);
    let _ = writeln!(out, "  stream: {}", v.stream);
    let _ = writeln!(out, "  status: {}", v.status);
    let _ = writeln!(out, "  operation: {}", v.operation_type);
    if let Some(k) = &v.document_key {
        let _ = writeln!(out, "  document key: {k}");
    }
    let _ = writeln!(out, "  token: {}", v.token);
    let _ = writeln!(
        out,
        "  attempts: {} ({}), first failed {}, last failed {}",
        v.attempts, v.error_kind, v.first_failed_at, v.last_failed_at
    );
    if let (Some(o), Some(e)) = (&v.owner, v.epoch) {
        let _ = writeln!(out, "  written by '{o}' with epoch {e}");
    }
    out.push_str("  errors (outermost first):\n");
    for e in &v.error_chain {
        let _ = writeln!(out, "    - {e}");
    }
    let _ = writeln!(
        out,
        "  event{}: {}",
        if v.truncated { " (truncated)" } else { "" },
        v.event
    );
}
