//! `flowwarden checkpoint show` and `flowwarden checkpoint reset`.
//!
//! A reset writes one checkpoint with both positions (`lastProcessed` and `lastSeen`) at the new
//! position, through the runtime's own codec, so the resume cascade starts there under either
//! `resume_strategy`. It keeps the stored fencing epoch (a deposed leader still cannot write
//! over it) and replaces the document only if it is still the one that was read (a conditional
//! write on `updatedAt`/`claimedAt`/`epoch`): a stream that saved in between is not overwritten.

use bson::{doc, DateTime, Document};
use flowwarden::port::codec::{encode_checkpoint, CLAIMED_AT};
use flowwarden::port::{Checkpoint, StoredPosition};
use futures::TryStreamExt;

use super::connect::Conn;
use super::error::CliError;
use super::facts::{stream_facts, Stored, StreamFacts};
use super::output::{Kind, Report};
use super::position::{self, Gap, NewPosition};
use super::views::{CheckpointView, ResetReport};
use super::{GlobalArgs, ResetArgs, CLI_OWNER};
use crate::stores::{code_of, DUPLICATE_KEY};

/// `flowwarden checkpoint show NAME`.
pub(crate) async fn show(conn: &Conn, g: &GlobalArgs, name: &str) -> Result<Report, CliError> {
    let facts = stream_facts(conn, g, name).await?;
    match &facts.checkpoint.stored {
        Stored::Missing => Err(unknown(conn, name).await),
        Stored::Corrupt(message) => Err(CliError::CorruptCheckpoint {
            stream: name.to_owned(),
            message: message.clone(),
        }),
        Stored::Claimed { .. } | Stored::Sound(_) => {
            Ok(Kind::Checkpoint(Box::new(CheckpointView::of(&facts))).into())
        }
    }
}

/// The error for a checkpoint that does not exist, naming the ones that do.
async fn unknown(conn: &Conn, name: &str) -> CliError {
    let known: Vec<String> = match conn
        .checkpoints()
        .find(doc! {})
        .projection(doc! { "_id": 1 })
        .sort(doc! { "_id": 1 })
        .limit(20)
        .await
    {
        Ok(cursor) => cursor
            .try_collect::<Vec<Document>>()
            .await
            .unwrap_or_default()
            .iter()
            .map(super::facts::id_string)
            .collect(),
        Err(_) => Vec::new(),
    };
    let hint = if known.is_empty() {
        "there is none".to_owned()
    } else {
        format!("known: {}", known.join(", "))
    };
    CliError::NotFound(format!(
        "no checkpoint named '{name}' in {}.{} ({hint}); `flowwarden streams` lists every stream",
        conn.database(),
        crate::CHECKPOINTS
    ))
}

/// `flowwarden checkpoint reset NAME --to-...`.
pub(crate) async fn reset(
    conn: &Conn,
    g: &GlobalArgs,
    args: &ResetArgs,
) -> Result<Report, CliError> {
    let name = args.name.as_str();
    // Parse what can be parsed before touching anything.
    let token_target = match &args.to.to_token {
        Some(json) => Some(position::at_token(json)?),
        None => None,
    };
    let facts = stream_facts(conn, g, name).await?;
    // A name nothing is stored under is most likely a typo: creating a checkpoint for it takes
    // --force (for example to start a stream that never ran at a chosen position).
    if facts.checkpoint.raw.is_none() && !args.force {
        return Err(unknown(conn, name).await);
    }
    let evidence = facts.running_evidence();
    if !evidence.is_empty() && !args.force {
        return Err(CliError::Refused(format!(
            "stream '{name}' looks running: {}. Stop the service first (a reset under a running stream is overwritten by its next save, or races it), or pass --force if you know it is stopped",
            evidence.join("; ")
        )));
    }
    let new = match (&token_target, &args.to.to_time) {
        (Some(t), _) => t.clone(),
        (None, Some(text)) => position::at_time(conn, text).await?,
        (None, None) => position::at_now(conn).await?,
    };
    let checkpoint = Checkpoint {
        stream: name.to_owned(),
        last_processed: Some(new.position.clone()),
        last_seen: Some(new.position.clone()),
        owner: Some(CLI_OWNER.to_owned()),
        epoch: stored_epoch(facts.checkpoint.raw.as_ref()),
        updated_at: DateTime::now(),
        snapshot: None,
    };
    write(conn, name, facts.checkpoint.raw.as_ref(), &checkpoint).await?;
    tracing::info!(
        stream = name,
        mode = new.mode,
        forced = args.force,
        "checkpoint reset"
    );
    Ok(Kind::Reset(Box::new(report(&facts, new, evidence, args.force))).into())
}

fn stored_epoch(raw: Option<&Document>) -> Option<i64> {
    match raw?.get("epoch")? {
        bson::Bson::Int64(e) => Some(*e),
        bson::Bson::Int32(e) => Some(i64::from(*e)),
        _ => None,
    }
}

/// Replaces `old` (or inserts when there was none), only if it did not change since read.
async fn write(
    conn: &Conn,
    name: &str,
    old: Option<&Document>,
    checkpoint: &Checkpoint,
) -> Result<(), CliError> {
    let new = encode_checkpoint(checkpoint);
    let moved = || {
        CliError::Refused(format!(
            "the checkpoint of '{name}' changed while it was being reset: the stream is running. Stop it and try again"
        ))
    };
    let what = format!("writing the checkpoint of '{name}'");
    match old {
        None => match conn.checkpoints().insert_one(new).await {
            Ok(_) => Ok(()),
            Err(e) if code_of(&e) == Some(DUPLICATE_KEY) => Err(moved()),
            Err(e) => Err(CliError::driver(&what, &e)),
        },
        Some(old) => {
            let mut filter = doc! { "_id": name };
            for key in ["updatedAt", CLAIMED_AT, "epoch", "owner"] {
                if let Some(v) = old.get(key) {
                    filter.insert(key, v.clone());
                }
            }
            let r = conn
                .checkpoints()
                .replace_one(filter, new)
                .await
                .map_err(|e| CliError::driver(&what, &e))?;
            if r.matched_count == 0 {
                return Err(moved());
            }
            Ok(())
        }
    }
}

fn report(
    facts: &StreamFacts,
    new: NewPosition,
    evidence: Vec<String>,
    forced: bool,
) -> ResetReport {
    let mut gaps: Vec<Gap> = Vec::new();
    let mut notes = new.warnings.clone();
    match &facts.checkpoint.stored {
        Stored::Sound(cp) => {
            let olds: [(&'static str, Option<&StoredPosition>); 2] = [
                ("lastProcessed", cp.last_processed.as_ref()),
                ("lastSeen", cp.last_seen.as_ref()),
            ];
            for (from, old) in olds {
                if let Some(old) = old {
                    gaps.push(position::gap(from, old, &new.position));
                }
            }
            if gaps.is_empty() {
                notes.push("the old checkpoint had no position: the stream would have started per its start_position; it now starts at the new position".into());
            }
        }
        Stored::Missing | Stored::Claimed { .. } => notes.push(
            "there was no stored position: the stream would have started per its start_position (default: now); it now starts at the new position".into(),
        ),
        Stored::Corrupt(m) => notes.push(format!(
            "the old checkpoint was corrupt ({m}): the gap against it is unknown"
        )),
    }
    if forced && !evidence.is_empty() {
        notes.push(format!(
            "forced although the stream looked running: {}; a running instance's next save overwrites this reset",
            evidence.join("; ")
        ));
    }
    ResetReport {
        stream: facts.name.clone(),
        old: facts.checkpoint.raw.clone(),
        old_view: match &facts.checkpoint.stored {
            Stored::Sound(cp) => Some(CheckpointView::positions(cp)),
            _ => None,
        },
        mode: new.mode,
        new: new.position,
        resumes: new.describe,
        gaps,
        notes,
        forced,
    }
}
