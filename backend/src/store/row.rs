//! Statements the same way on both databases: arguments bound to `$1, $2, …` in order, rows read
//! by column name. Each database module turns these into its driver's calls.

use std::error::Error as StdError;

/// A value bound to the next `$n` placeholder.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    Int(i64),
    Text(&'a str),
    OptText(Option<&'a str>),
}

/// [`Arg`] owned, for a statement run on another thread.
#[derive(Clone, Debug)]
pub enum OwnedArg {
    Int(i64),
    Text(String),
    OptText(Option<String>),
}

impl OwnedArg {
    pub fn borrow(&self) -> Arg<'_> {
        match self {
            OwnedArg::Int(n) => Arg::Int(*n),
            OwnedArg::Text(s) => Arg::Text(s),
            OwnedArg::OptText(s) => Arg::OptText(s.as_deref()),
        }
    }
}

impl From<Arg<'_>> for OwnedArg {
    fn from(arg: Arg<'_>) -> OwnedArg {
        match arg {
            Arg::Int(n) => OwnedArg::Int(n),
            Arg::Text(s) => OwnedArg::Text(s.to_owned()),
            Arg::OptText(s) => OwnedArg::OptText(s.map(str::to_owned)),
        }
    }
}

pub type RowError = Box<dyn StdError + Send + Sync>;

/// A result row, read by column name.
pub trait Row {
    fn opt_int(&self, column: &str) -> Result<Option<i64>, RowError>;
    fn opt_text(&self, column: &str) -> Result<Option<String>, RowError>;

    fn int(&self, column: &str) -> Result<i64, RowError> {
        self.opt_int(column)?
            .ok_or_else(|| format!("column {column} is NULL").into())
    }

    fn text(&self, column: &str) -> Result<String, RowError> {
        self.opt_text(column)?
            .ok_or_else(|| format!("column {column} is NULL").into())
    }
}

/// How a row becomes a value: a plain function, so that it can travel to a reader thread.
pub type ReadRow<T> = fn(&dyn Row) -> Result<T, RowError>;

/// A statement shared by both databases but for a few words, written once as a template:
///
/// - `{now}`: the time, in Unix ms. PostgreSQL reads its own clock (instances sharing the
///   database may disagree about theirs, and a lease or a due time must mean the same to all);
///   SQLite, held by one process, binds that process's clock as `$now`.
/// - `{skip_locked}`: PostgreSQL locks the rows a subquery picks and skips rows another
///   transaction holds (so that two instances never pick the same rows, and never wait for
///   each other); SQLite's one writer needs nothing.
pub struct Template {
    text: &'static str,
    sqlite: std::sync::OnceLock<String>,
    postgres: std::sync::OnceLock<String>,
}

/// PostgreSQL's clock in Unix ms, the same for the whole statement.
const POSTGRES_NOW: &str = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)";

impl Template {
    pub const fn new(text: &'static str) -> Template {
        Template {
            text,
            sqlite: std::sync::OnceLock::new(),
            postgres: std::sync::OnceLock::new(),
        }
    }

    pub fn sqlite(&self) -> &str {
        self.sqlite.get_or_init(|| {
            self.text
                .replace("{now}", "$now")
                .replace("{skip_locked}", "")
        })
    }

    pub fn postgres(&self) -> &str {
        self.postgres.get_or_init(|| {
            self.text
                .replace("{now}", POSTGRES_NOW)
                .replace("{skip_locked}", " FOR UPDATE SKIP LOCKED")
        })
    }
}

/// `sql` with each `$n` placeholder replaced by `with(n)`: a statement composed into another
/// (its placeholders shifted), or spelled out for a tool that binds its own way (the bench's
/// pgbench scripts), so that one text of each statement serves every use.
pub fn replace_placeholders(sql: &str, with: impl Fn(usize) -> String) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        match after[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&with(n)),
            Err(_) => out.push('$'),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::replace_placeholders;

    #[test]
    fn placeholders_are_replaced_by_number_and_nothing_else() {
        assert_eq!(
            replace_placeholders("a = $1 AND b = $12 AND c = $now AND d = '$'", |n| format!(
                "${}",
                n + 5
            )),
            "a = $6 AND b = $17 AND c = $now AND d = '$'"
        );
    }
}
