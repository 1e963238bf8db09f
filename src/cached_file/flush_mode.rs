//! How a flush's batch goes out: from which write slots, beside what, and
//! whether it may be written durably ([`FlushMode`]). Plain values, chosen
//! by the callers of the flush pipeline (a plain flush, a group commit
//! round, a direct commit) and read by the steps that write.

/// Which write slots a flush writes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotKind {
    /// The file's write slots ([`Config::rounds_in_flight`](crate::Config::rounds_in_flight)
    /// of them), with the engine resolved at open.
    Shared,
    /// An inline slot of a direct commit: `pwritev` from the committing
    /// thread, beside other direct commits' writes.
    Inline,
}

/// What runs beside a flush while it writes: the ring writes a one-run
/// flush inline only when nothing does (see `RunWriter::writes_inline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Company {
    /// No commit round is syncing meanwhile.
    Alone,
    /// Commit rounds may be syncing beside this flush.
    Rounds,
}

/// How one flush goes out (`FlushPipeline::flush_for_commit`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlushMode {
    pub(crate) slot: SlotKind,
    pub(crate) company: Company,
    /// `Some(seq)`: a batch of one run may be written durably
    /// (`RWF_DSYNC`) instead of being `fdatasync`ed, if the last
    /// `fdatasync` covered `write_seq` up to `seq` and nothing was written
    /// since ([`Pass::durable_seq`] says whether it was).
    pub(crate) durable_write_at: Option<u64>,
}

impl FlushMode {
    /// A flush for the OS only (`flush()`, backpressure): shared slots,
    /// nothing durable.
    pub(crate) const PLAIN: Self = Self {
        slot: SlotKind::Shared,
        company: Company::Rounds,
        durable_write_at: None,
    };
    /// A direct commit's flush: its own inline slot, no round beside it.
    pub(crate) const DIRECT: Self = Self {
        slot: SlotKind::Inline,
        company: Company::Alone,
        durable_write_at: None,
    };
}
