//! Reading an answer's body no further than a limit: a misbehaving hop (a proxy, a URL that
//! points elsewhere) cannot make the relay hold an endless body in memory.

use super::classify::error_chain;

/// The most of an answer to a question (a store, a page of stores, a model, a token) the relay
/// reads: OpenFGA's largest is a model, which it caps at 256 KiB by default.
pub(super) const MAX_QUESTION_ANSWER: usize = 4 << 20;

/// Reads `resp`'s body, no further than `limit` bytes. Returns what was read, and whether the
/// body ended within the limit (past it, the rest is not read).
pub(super) async fn read_at_most(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = limit.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

/// The whole body of an answer to a question, no larger than [`MAX_QUESTION_ANSWER`]; why not,
/// as a sentence.
pub(super) async fn read_whole(resp: reqwest::Response) -> Result<Vec<u8>, String> {
    match read_at_most(resp, MAX_QUESTION_ANSWER).await {
        Ok((body, true)) => Ok(body),
        Ok((_, false)) => Err(format!(
            "the answer is larger than {} MiB, more than OpenFGA ever answers: not read (is the \
             URL OpenFGA's?)",
            MAX_QUESTION_ANSWER >> 20
        )),
        Err(e) => Err(error_chain(&e)),
    }
}
