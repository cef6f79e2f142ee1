//! `flowwarden lease show|release`, on the crate's lease store (`_fw_locks`, judged by the
//! server's clock).
//!
//! Release does what the holder's own release does: the document stays and its `expiresAt`
//! becomes the server's now, so the epoch keeps growing and a holder that is in fact still
//! alive is fenced (its writes carry an older epoch) once another instance takes the lease.
//! A held lease is released only with `--force`.

use bson::doc;
use flowwarden::port::{Lease, LeaseStore};
use futures::TryStreamExt;

use super::connect::Conn;
use super::error::CliError;
use super::facts::{LeaseFacts, GUARD_SUFFIX};
use super::output::{Kind, Report};
use super::views::{date, LeaseView};

/// `flowwarden lease show NAME`: the leases `NAME` and `NAME#checkpoint`.
pub(crate) async fn show(conn: &Conn, name: &str) -> Result<Report, CliError> {
    let clock = conn.clock().await?;
    let mut names = vec![name.to_owned()];
    if !name.ends_with(GUARD_SUFFIX) {
        names.push(format!("{name}{GUARD_SUFFIX}"));
    }
    let what = format!("reading the leases of '{name}'");
    let docs: Vec<bson::Document> = conn
        .locks()
        .find(doc! { "_id": { "$in": &names } })
        .sort(doc! { "_id": 1 })
        .await
        .map_err(|e| CliError::driver(&what, &e))?
        .try_collect()
        .await
        .map_err(|e| CliError::driver(&what, &e))?;
    if docs.is_empty() {
        return Err(CliError::NotFound(format!(
            "no lease named {} in {}.{}: the stream is not SingleLeader and has no checkpoint guard, or never ran",
            names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(" or "),
            conn.database(),
            crate::LOCKS
        )));
    }
    let facts: Vec<LeaseFacts> = docs.iter().map(|d| LeaseFacts::of(d, &clock)).collect();
    if let Some(Err(e)) = facts.iter().map(|f| f.lease.as_ref()).find(|l| l.is_err()) {
        return Err(CliError::Corrupt(format!(
            "{e}; `flowwarden lease release` cannot act on it either: repair or delete the document by hand only once every instance of the stream is stopped (docs/runbooks/fenced.md)"
        )));
    }
    Ok(Kind::Leases {
        name: name.to_owned(),
        server_time: date(clock.now),
        leases: facts.iter().map(|f| LeaseView::of(f, &clock)).collect(),
    }
    .into())
}

/// `flowwarden lease release NAME [--force]`.
pub(crate) async fn release(conn: &Conn, name: &str, force: bool) -> Result<Report, CliError> {
    let clock = conn.clock().await?;
    let current = conn.backend.current(name).await.map_err(CliError::store)?;
    let Some(lease) = current else {
        let guard = format!("{name}{GUARD_SUFFIX}");
        let hint = match conn.backend.current(&guard).await {
            Ok(Some(_)) => format!(" (there is a checkpoint guard '{guard}': release that name)"),
            _ => String::new(),
        };
        return Err(CliError::NotFound(format!(
            "no lease named '{name}' in {}.{}{hint}",
            conn.database(),
            crate::LOCKS
        )));
    };
    let facts = LeaseFacts::of(&lease_document(&lease), &clock);
    let view = LeaseView::of(&facts, &clock);
    if !facts.held {
        return Ok(Kind::Released {
            lease: view,
            released: false,
            forced: force,
        }
        .into());
    }
    if !force {
        return Err(CliError::Refused(format!(
            "lease '{name}' is held by '{}' (epoch {}) until {} ({} s from now by the server's clock): its holder may be running. Stop it (a graceful stop releases the lease) or, once you know it is gone, pass --force; a holder that is still alive is then fenced when another instance takes over",
            lease.owner,
            lease.epoch,
            date(lease.expires_at),
            view.expires_in_secs.unwrap_or_default()
        )));
    }
    conn.backend
        .release(&lease)
        .await
        .map_err(CliError::store)?;
    // The release matches only this owner and epoch: check it took effect.
    let after = conn.backend.current(name).await.map_err(CliError::store)?;
    let clock = conn.clock().await?;
    match after {
        Some(a) if a.epoch == lease.epoch && a.owner == lease.owner && !a.expires_at.gt(&clock.now) => {}
        Some(a) => {
            return Err(CliError::Refused(format!(
                "lease '{name}' changed while it was being released: now held by '{}' with epoch {} until {}",
                a.owner,
                a.epoch,
                date(a.expires_at)
            )))
        }
        None => {}
    }
    tracing::info!(lease = name, owner = %lease.owner, epoch = lease.epoch, "lease released (forced)");
    Ok(Kind::Released {
        lease: view,
        released: true,
        forced: force,
    }
    .into())
}

fn lease_document(l: &Lease) -> bson::Document {
    crate::LeaseDocument {
        stream: l.stream.clone(),
        owner: l.owner.clone(),
        epoch: l.epoch,
        expires_at: l.expires_at,
    }
    .to_document()
}
