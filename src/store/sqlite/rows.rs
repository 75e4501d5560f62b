//! Store stage, SQLite rows read back: one `SELECT_COLUMNS` row into a record (reusing its
//! buffers) or into CSV fields borrowed from the row.

use rusqlite::Row;

use crate::store::record::{CsvRow, UsageRecord};

fn set_text(dst: &mut String, row: &Row<'_>, i: usize) -> rusqlite::Result<()> {
    dst.clear();
    dst.push_str(row.get_ref(i)?.as_str()?);
    Ok(())
}

fn get_u64(row: &Row<'_>, i: usize) -> rusqlite::Result<u64> {
    Ok(u64::try_from(row.get::<_, i64>(i)?).unwrap_or(0))
}

/// Reads one `SELECT_COLUMNS` row into `rec`, reusing its string buffers (exports read a
/// million rows; allocating six strings per row would dominate). Returns its `seq`.
pub(super) fn read_row(row: &Row<'_>, rec: &mut UsageRecord) -> rusqlite::Result<i64> {
    let seq: i64 = row.get(0)?;
    rec.time_ms = row.get(1)?;
    set_text(&mut rec.request_id, row, 2)?;
    set_text(&mut rec.key_id, row, 3)?;
    set_text(&mut rec.listener, row, 4)?;
    set_text(&mut rec.endpoint, row, 5)?;
    set_text(&mut rec.model, row, 6)?;
    rec.status = u16::try_from(row.get::<_, i64>(7)?).unwrap_or(0);
    rec.stream = row.get(8)?;
    rec.prompt_tokens = get_u64(row, 9)?;
    rec.completion_tokens = get_u64(row, 10)?;
    rec.total_tokens = get_u64(row, 11)?;
    rec.cost = row.get(12)?;
    rec.latency_ms = get_u64(row, 13)?;
    rec.ttft_ms = row
        .get::<_, Option<i64>>(14)?
        .map(|v| u64::try_from(v).unwrap_or(0));
    set_text(&mut rec.upstream, row, 15)?;
    rec.estimated = row.get(16)?;
    rec.attempts = u32::try_from(row.get::<_, i64>(17)?).unwrap_or(0);
    set_text(&mut rec.served_model, row, 18)?;
    set_text(&mut rec.cut, row, 19)?;
    rec.cached_prompt_tokens = get_u64(row, 20)?;
    rec.cache_write_tokens = get_u64(row, 21)?;
    rec.reasoning_tokens = get_u64(row, 22)?;
    Ok(seq)
}

fn text<'r>(row: &'r Row<'_>, i: usize) -> rusqlite::Result<&'r [u8]> {
    Ok(row.get_ref(i)?.as_bytes()?)
}

fn int_u64(row: &Row<'_>, i: usize) -> rusqlite::Result<u64> {
    Ok(u64::try_from(row.get_ref(i)?.as_i64()?).unwrap_or(0))
}

/// One `SELECT_COLUMNS` row as CSV fields, borrowed from the row (what `read_row` and
/// `UsageRecord::write_csv` would give, without copying a string). Returns its `seq` too.
pub(super) fn csv_row<'r>(row: &'r Row<'_>) -> rusqlite::Result<(i64, CsvRow<'r>)> {
    let seq = row.get_ref(0)?.as_i64()?;
    let status = u16::try_from(row.get_ref(7)?.as_i64()?).map_or(0, u64::from);
    let ttft_ms = row
        .get_ref(14)?
        .as_i64_or_null()?
        .map(|v| u64::try_from(v).unwrap_or(0));
    Ok((
        seq,
        CsvRow {
            time_ms: row.get_ref(1)?.as_i64()?,
            request_id: text(row, 2)?,
            key_id: text(row, 3)?,
            listener: text(row, 4)?,
            endpoint: text(row, 5)?,
            model: text(row, 6)?,
            status,
            stream: row.get_ref(8)?.as_i64()? != 0,
            prompt_tokens: int_u64(row, 9)?,
            completion_tokens: int_u64(row, 10)?,
            total_tokens: int_u64(row, 11)?,
            cost: row.get(12)?,
            latency_ms: int_u64(row, 13)?,
            ttft_ms,
            upstream: text(row, 15)?,
            estimated: row.get_ref(16)?.as_i64()? != 0,
            attempts: int_u64(row, 17)?,
            served_model: text(row, 18)?,
            cut: text(row, 19)?,
            details: [int_u64(row, 20)?, int_u64(row, 21)?, int_u64(row, 22)?],
        },
    ))
}

/// An empty record for `read_row` to fill.
pub(super) fn blank_record() -> UsageRecord {
    UsageRecord {
        time_ms: 0,
        request_id: String::new(),
        key_id: String::new(),
        listener: String::new(),
        endpoint: String::new(),
        model: String::new(),
        status: 0,
        stream: false,
        prompt_tokens: 0,
        completion_tokens: 0,
        total_tokens: 0,
        cost: 0.0,
        latency_ms: 0,
        ttft_ms: None,
        upstream: String::new(),
        estimated: false,
        attempts: 0,
        served_model: String::new(),
        cut: String::new(),
        cached_prompt_tokens: 0,
        cache_write_tokens: 0,
        reasoning_tokens: 0,
    }
}
