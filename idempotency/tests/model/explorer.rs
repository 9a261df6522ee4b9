//! Every schedule of a bounded world, depth first: a run makes its choices through
//! [`Explorer::pick`]; the next run replays the choices of the last one up to its deepest choice
//! with options left, and takes the next option there. The world must be deterministic given
//! its choices (it is: ordered maps, no threads, no timers of its own).

/// A schedule that broke an invariant: what broke, and the steps that led there.
#[derive(Debug)]
pub struct Violation {
    pub what: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.what)?;
        for (i, step) in self.trace.iter().enumerate() {
            writeln!(f, "  {:>2}. {step}", i + 1)?;
        }
        Ok(())
    }
}

#[derive(Default)]
pub struct Explorer {
    /// The choices to replay before choosing freshly.
    prefix: Vec<usize>,
    /// This run's choices so far: (taken, how many there were).
    made: Vec<(usize, usize)>,
}

impl Explorer {
    /// One of `options` choices; a run with one option makes no choice.
    pub fn pick(&mut self, options: usize) -> usize {
        assert!(options > 0, "a choice among nothing");
        if options == 1 {
            return 0;
        }
        let depth = self.made.len();
        let taken = self.prefix.get(depth).copied().unwrap_or(0);
        assert!(
            taken < options,
            "the world is not deterministic: choice {depth} had more options before"
        );
        self.made.push((taken, options));
        taken
    }

    /// Sets up the next schedule; `false` once every one has run.
    fn advance(&mut self) -> bool {
        while let Some((taken, options)) = self.made.pop() {
            if taken + 1 < options {
                self.prefix = self.made.iter().map(|&(taken, _)| taken).collect();
                self.prefix.push(taken + 1);
                self.made.clear();
                return true;
            }
        }
        false
    }
}

/// How an exploration ended.
#[derive(Debug)]
pub struct Report {
    /// Schedules run, the failing one included.
    pub schedules: u64,
    /// The longest schedule's number of choices.
    pub deepest: usize,
    pub violation: Option<Violation>,
}

/// Runs `world` under every schedule, stopping at the first that breaks an invariant.
pub fn explore(mut world: impl FnMut(&mut Explorer) -> Result<(), Violation>) -> Report {
    let mut explorer = Explorer::default();
    let mut report = Report {
        schedules: 0,
        deepest: 0,
        violation: None,
    };
    loop {
        report.schedules += 1;
        let ran = world(&mut explorer);
        report.deepest = report.deepest.max(explorer.made.len());
        if let Err(violation) = ran {
            report.violation = Some(violation);
            return report;
        }
        if !explorer.advance() {
            return report;
        }
    }
}
