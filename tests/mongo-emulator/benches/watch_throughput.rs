//! Streams 100,000 inserts through `watch()` of the real driver against the in-process
//! emulator and prints the events per second observed by the change stream.
//!
//! Run with `cargo bench -p mongo-emulator --bench watch_throughput`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mongo_emulator::Emulator;
use mongodb::bson::{doc, Document};
use mongodb::Client;

const EVENTS: usize = 100_000;
const BATCH: usize = 1_000;

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let emu = Emulator::start().await?;
    let client = Client::with_uri_str(emu.uri()).await?;
    let coll = client.database("bench").collection::<Document>("events");
    coll.insert_one(doc! {"warm": true}).await?;
    let mut stream = coll.watch().await?;

    let writer_coll = coll.clone();
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let mut next = 0usize;
        while next < EVENTS {
            let docs: Vec<Document> = (next..next + BATCH)
                .map(|i| doc! {"_id": i as i64, "seq": i as i64, "payload": "abcdefghijklmnopqrstuvwxyz012345"})
                .collect();
            writer_coll.insert_many(docs).await?;
            next += BATCH;
        }
        Ok::<Instant, mongodb::error::Error>(Instant::now())
    });

    let mut received = 0usize;
    let mut expected_seq = 0i64;
    while received < EVENTS {
        let event = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .map_err(|_| "no event within 60 s")?
            .ok_or("stream ended")??;
        let seq = event
            .full_document
            .as_ref()
            .and_then(|d| d.get_i64("seq").ok())
            .ok_or("event without seq")?;
        if seq != expected_seq {
            return Err(format!("out of order: got {seq}, expected {expected_seq}").into());
        }
        expected_seq += 1;
        received += 1;
    }
    let elapsed = start.elapsed();
    let writes_done = writer.await??;
    let secs = elapsed.as_secs_f64();
    println!(
        "watch_throughput: {received} insert events through watch() in {:.3} s = {:.0} events/s (writer finished after {:.3} s)",
        secs,
        received as f64 / secs,
        writes_done.duration_since(start).as_secs_f64()
    );
    Ok(())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(run()) {
        eprintln!("watch_throughput failed: {e}");
        std::process::exit(1);
    }
}
