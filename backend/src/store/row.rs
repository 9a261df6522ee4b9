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
