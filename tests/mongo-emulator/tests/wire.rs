//! Untrusted wire input: garbage never takes the emulator down, and unacknowledged writes work.

mod common;

use std::time::Duration;

use common::{bounded, setup};
use mongodb::bson::{doc, Document};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn op_msg(request_id: i32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    let len = i32::try_from(16 + 4 + 1 + body.len()).expect("small");
    m.extend_from_slice(&len.to_le_bytes());
    m.extend_from_slice(&request_id.to_le_bytes());
    m.extend_from_slice(&0i32.to_le_bytes());
    m.extend_from_slice(&2013i32.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.push(0);
    m.extend_from_slice(body);
    m
}

async fn read_reply(s: &mut TcpStream) -> Document {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.expect("reply header");
    let len = usize::try_from(i32::from_le_bytes(len)).expect("positive");
    let mut rest = vec![0u8; len - 4];
    s.read_exact(&mut rest).await.expect("reply body");
    assert_eq!(
        i32::from_le_bytes(rest[8..12].try_into().expect("4 bytes")),
        2013,
        "OP_MSG reply"
    );
    Document::from_reader(&rest[12 + 4 + 1..]).expect("reply is BSON")
}

async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn garbage_closes_the_connection_but_not_the_server() {
    bounded(async {
        let (emu, client) = setup().await;
        // A length far beyond maxMessageSizeBytes.
        let mut s = TcpStream::connect(emu.addr()).await.expect("connect");
        s.write_all(&[0xFF; 64]).await.expect("write");
        assert!(closed(&mut s).await, "connection closed after a bad header");
        // An OP_QUERY.
        let mut s = TcpStream::connect(emu.addr()).await.expect("connect");
        let mut q = op_msg(
            1,
            0,
            &mongodb::bson::to_vec(&doc! {"isMaster": 1}).expect("bson"),
        );
        q[12..16].copy_from_slice(&2004i32.to_le_bytes());
        s.write_all(&q).await.expect("write");
        assert!(closed(&mut s).await, "OP_QUERY is not served");
        // A body whose BSON is broken inside a valid frame gets an error reply.
        let mut s = TcpStream::connect(emu.addr()).await.expect("connect");
        let mut body = mongodb::bson::to_vec(&doc! {"ping": 1, "$db": "admin"}).expect("bson");
        body[4] = 0x7F; // invalid element type
        s.write_all(&op_msg(2, 0, &body)).await.expect("write");
        let reply = read_reply(&mut s).await;
        assert_eq!(reply.get_f64("ok"), Ok(0.0));
        assert_eq!(reply.get_i32("code"), Ok(22));
        // The same connection still answers a valid command.
        let ping = mongodb::bson::to_vec(&doc! {"ping": 1, "$db": "admin"}).expect("bson");
        s.write_all(&op_msg(3, 0, &ping)).await.expect("write");
        assert_eq!(read_reply(&mut s).await.get_f64("ok"), Ok(1.0));
        // A truncated frame followed by EOF.
        let mut s = TcpStream::connect(emu.addr()).await.expect("connect");
        let frame = op_msg(4, 0, &ping);
        s.write_all(&frame[..frame.len() - 3]).await.expect("write");
        s.shutdown().await.expect("shutdown");
        assert!(closed(&mut s).await);

        client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .expect("driver still served");
    })
    .await;
}

#[tokio::test]
async fn more_to_come_requests_get_no_reply_and_still_apply() {
    bounded(async {
        let emu = mongo_emulator::Emulator::start().await.expect("start");
        let mut s = TcpStream::connect(emu.addr()).await.expect("connect");
        let insert =
            mongodb::bson::to_vec(&doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"})
                .expect("bson");
        s.write_all(&op_msg(10, 1 << 1, &insert))
            .await
            .expect("write");
        let ping = mongodb::bson::to_vec(&doc! {"ping": 1, "$db": "admin"}).expect("bson");
        s.write_all(&op_msg(11, 0, &ping)).await.expect("write");
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.expect("reply header");
        let mut rest = vec![0u8; usize::try_from(i32::from_le_bytes(len)).expect("positive") - 4];
        s.read_exact(&mut rest).await.expect("reply");
        let response_to = i32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        assert_eq!(
            response_to, 11,
            "the first reply answers the ping, not the moreToCome insert"
        );
        assert_eq!(
            emu.documents("d", "c").expect("collection"),
            vec![doc! {"_id": 1}]
        );
    })
    .await;
}
