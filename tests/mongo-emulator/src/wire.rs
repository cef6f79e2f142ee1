//! MongoDB wire protocol framing: the standard message header and OP_MSG ("OP_MSG" and
//! "MongoDB Wire Protocol" in the manual). Only what driver 3.x sends is accepted.

use bson::{Bson, Document};
use tokio::io::{AsyncRead, AsyncReadExt};

/// OP_MSG opcode.
pub(crate) const OP_MSG: i32 = 2013;
/// Largest message accepted (the `maxMessageSizeBytes` announced in `hello`, plus slack).
pub(crate) const MAX_MESSAGE: usize = 48_000_000 + 16 * 1024;

const FLAG_CHECKSUM: u32 = 1;
pub(crate) const FLAG_MORE_TO_COME: u32 = 1 << 1;
const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad message length {0}")]
    Length(i64),
    #[error("unsupported opcode {0} (only OP_MSG 2013 is emulated)")]
    OpCode(i32),
    #[error("malformed OP_MSG: {0}")]
    Malformed(String),
}

/// One decoded request.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) request_id: i32,
    pub(crate) flags: u32,
    /// The command body, with kind-1 document sequences folded in as arrays.
    pub(crate) body: Result<Document, String>,
}

fn le_i32(b: &[u8], at: usize) -> Option<i32> {
    let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(i32::from_le_bytes(bytes))
}

/// Reads one message. `Ok(None)` on a clean end of stream before a header.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<Request>, WireError> {
    let mut header = [0u8; 16];
    match reader.read_exact(&mut header[..4]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    reader.read_exact(&mut header[4..]).await?;
    let len = le_i32(&header, 0).unwrap_or(0);
    let total = usize::try_from(len).map_err(|_| WireError::Length(i64::from(len)))?;
    if !(16 + 5..=MAX_MESSAGE).contains(&total) {
        return Err(WireError::Length(i64::from(len)));
    }
    let request_id = le_i32(&header, 4).unwrap_or(0);
    let op_code = le_i32(&header, 12).unwrap_or(0);
    buf.clear();
    buf.resize(total - 16, 0);
    reader.read_exact(buf).await?;
    if op_code != OP_MSG {
        return Err(WireError::OpCode(op_code));
    }
    let (flags, body) = parse_op_msg(buf)?;
    Ok(Some(Request {
        request_id,
        flags,
        body,
    }))
}

type ParsedMsg = (u32, Result<Document, String>);

fn parse_op_msg(msg: &[u8]) -> Result<ParsedMsg, WireError> {
    let bad = |m: &str| WireError::Malformed(m.to_string());
    let flags = u32::from_le_bytes(
        msg.get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad("missing flagBits"))?,
    );
    let known = FLAG_CHECKSUM | FLAG_MORE_TO_COME | FLAG_EXHAUST_ALLOWED;
    if flags & 0xFFFF & !known != 0 {
        return Err(bad("unknown required flag bits"));
    }
    let end = if flags & FLAG_CHECKSUM != 0 {
        msg.len()
            .checked_sub(4)
            .ok_or_else(|| bad("missing checksum"))?
    } else {
        msg.len()
    };
    let mut at = 4;
    let mut body: Option<Document> = None;
    let mut sequences: Vec<(String, Vec<Bson>)> = Vec::new();
    let mut bson_error: Option<String> = None;
    while at < end {
        let kind = msg[at];
        at += 1;
        match kind {
            0 => {
                let size = doc_size(msg, at, end)?;
                match Document::from_reader(&msg[at..at + size]) {
                    Ok(d) => body = Some(d),
                    Err(e) => bson_error = Some(e.to_string()),
                }
                at += size;
            }
            1 => {
                let size = usize::try_from(le_i32(msg, at).ok_or_else(|| bad("short section"))?)
                    .map_err(|_| bad("negative section size"))?;
                let sec_end = at.checked_add(size).filter(|e| *e <= end && size >= 5);
                let sec_end = sec_end.ok_or_else(|| bad("section overruns message"))?;
                let mut p = at + 4;
                let nul = msg[p..sec_end]
                    .iter()
                    .position(|b| *b == 0)
                    .ok_or_else(|| bad("unterminated section identifier"))?;
                let ident = std::str::from_utf8(&msg[p..p + nul])
                    .map_err(|_| bad("identifier is not UTF-8"))?
                    .to_string();
                p += nul + 1;
                let mut docs = Vec::new();
                while p < sec_end {
                    let size = doc_size(msg, p, sec_end)?;
                    match Document::from_reader(&msg[p..p + size]) {
                        Ok(d) => docs.push(Bson::Document(d)),
                        Err(e) => bson_error = Some(e.to_string()),
                    }
                    p += size;
                }
                sequences.push((ident, docs));
                at = sec_end;
            }
            other => {
                return Err(WireError::Malformed(format!(
                    "unknown section kind {other}"
                )))
            }
        }
    }
    if let Some(e) = bson_error {
        return Ok((flags, Err(e)));
    }
    let mut body = body.ok_or_else(|| bad("no kind-0 body section"))?;
    for (ident, docs) in sequences {
        body.insert(ident, docs);
    }
    Ok((flags, Ok(body)))
}

fn doc_size(msg: &[u8], at: usize, end: usize) -> Result<usize, WireError> {
    let size = le_i32(msg, at)
        .and_then(|s| usize::try_from(s).ok())
        .ok_or_else(|| WireError::Malformed("short document".into()))?;
    if size < 5 || at + size > end {
        return Err(WireError::Malformed("document overruns section".into()));
    }
    Ok(size)
}

/// Encodes an OP_MSG reply (flagBits 0, one kind-0 section) into `out`.
pub(crate) fn encode_reply(
    out: &mut Vec<u8>,
    request_id: i32,
    response_to: i32,
    body: &crate::commands::Reply,
) -> Result<(), bson::ser::Error> {
    out.clear();
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    match body {
        crate::commands::Reply::Doc(d) => d.to_writer(&mut *out)?,
        crate::commands::Reply::Raw(r) => out.extend_from_slice(r.as_bytes()),
    }
    let len = i32::try_from(out.len()).unwrap_or(i32::MAX);
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&request_id.to_le_bytes());
    out[8..12].copy_from_slice(&response_to.to_le_bytes());
    out[12..16].copy_from_slice(&OP_MSG.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn frame(flags: u32, sections: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        let len = (16 + 4 + sections.len()) as i32;
        m.extend_from_slice(&len.to_le_bytes());
        m.extend_from_slice(&7i32.to_le_bytes());
        m.extend_from_slice(&0i32.to_le_bytes());
        m.extend_from_slice(&OP_MSG.to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(sections);
        m
    }

    #[tokio::test]
    async fn folds_document_sequences_into_the_body() {
        let mut sections = vec![0u8];
        sections.extend(bson::to_vec(&doc! {"insert": "c", "$db": "d"}).expect("encodes"));
        let d1 = bson::to_vec(&doc! {"_id": 1}).expect("encodes");
        let d2 = bson::to_vec(&doc! {"_id": 2}).expect("encodes");
        let size = 4 + "documents".len() + 1 + d1.len() + d2.len();
        sections.push(1);
        sections.extend((size as i32).to_le_bytes());
        sections.extend(b"documents\0");
        sections.extend(d1);
        sections.extend(d2);
        let msg = frame(0, &sections);
        let mut buf = Vec::new();
        let req = read_request(&mut &msg[..], &mut buf)
            .await
            .expect("reads")
            .expect("one");
        assert_eq!(req.request_id, 7);
        assert_eq!(
            req.body.expect("valid"),
            doc! {"insert": "c", "$db": "d", "documents": [{"_id": 1}, {"_id": 2}]}
        );
    }

    #[tokio::test]
    async fn rejects_garbage_without_panicking() {
        let mut buf = Vec::new();
        let short = frame(0, &[0, 1, 2]);
        assert!(read_request(&mut &short[..], &mut buf).await.is_err());
        let huge = [0xFFu8; 16];
        assert!(read_request(&mut &huge[..], &mut buf).await.is_err());
        let mut op_query = frame(0, &[0, 5, 0, 0, 0, 0]);
        op_query[12..16].copy_from_slice(&2004i32.to_le_bytes());
        assert!(matches!(
            read_request(&mut &op_query[..], &mut buf).await,
            Err(WireError::OpCode(2004))
        ));
        let bad_flags = frame(1 << 5, &[0, 5, 0, 0, 0, 0]);
        assert!(read_request(&mut &bad_flags[..], &mut buf).await.is_err());
        let overrun = frame(0, &[0, 50, 0, 0, 0, 0]);
        assert!(read_request(&mut &overrun[..], &mut buf).await.is_err());
        assert!(read_request(&mut &[][..], &mut buf)
            .await
            .expect("eof is clean")
            .is_none());
    }
}
