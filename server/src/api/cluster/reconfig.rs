//! Whether a membership change may be proposed, as etcd decides before proposing one:
//! `--max-learners` always, and with `--strict-reconfig-check` (the default) the quorum
//! checks, so that no change leaves the cluster unable to commit. A member counts as started
//! once it has published its name (etcd's `IsStarted`).
//!
//! Worked example, three voters of which one never started (no name yet):
//! - adding a voter makes four, whose quorum is three: two started are too few, refused;
//! - removing the unstarted one leaves two, whose quorum is two: both started, allowed;
//! - removing a started one leaves one started of two, whose quorum is two: refused.

use cairn_engine::Member;

/// A member as the checks see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seat {
    /// Its ID.
    pub id: u64,
    /// It does not vote.
    pub is_learner: bool,
    /// It has published its name: it runs.
    pub started: bool,
}

impl From<&Member> for Seat {
    fn from(m: &Member) -> Seat {
        Seat {
            id: m.id,
            is_learner: m.is_learner,
            started: !m.name.is_empty(),
        }
    }
}

/// The rules the flags set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconfig {
    /// `--strict-reconfig-check`.
    pub strict: bool,
    /// `--max-learners`.
    pub max_learners: usize,
}

impl Default for Reconfig {
    fn default() -> Self {
        Reconfig {
            strict: true,
            max_learners: 1,
        }
    }
}

/// A change asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// MemberAdd of a voter.
    AddVoter,
    /// MemberAdd with `isLearner`.
    AddLearner,
    /// MemberRemove of this member.
    Remove(u64),
    /// MemberPromote of this learner.
    Promote(u64),
}

/// Why a change is refused, with etcd's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A learner more than `--max-learners` allows.
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    /// Too few started voters would be left for a quorum.
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStarted,
}

fn started(m: &Seat) -> bool {
    m.started
}

/// Whether `change` may be proposed to a cluster of `members`.
pub fn check(members: &[Seat], change: Change, rules: Reconfig) -> Result<(), Refused> {
    let voters = || members.iter().filter(|m| !m.is_learner);
    let learners = members.iter().filter(|m| m.is_learner).count();
    if change == Change::AddLearner && learners + 1 > rules.max_learners {
        return Err(Refused::TooManyLearners);
    }
    if !rules.strict {
        return Ok(());
    }
    // Voters after the change, and how many of them have started.
    let (total, up) = match change {
        Change::AddLearner => return Ok(()),
        // The new voter has not started yet.
        Change::AddVoter => (voters().count() + 1, voters().filter(|m| started(m)).count()),
        Change::Promote(id) => {
            // Not a learner: the engine answers that, with etcd's error.
            let Some(learner) = members.iter().find(|m| m.id == id && m.is_learner) else {
                return Ok(());
            };
            (
                voters().count() + 1,
                voters().filter(|m| started(m)).count() + usize::from(started(learner)),
            )
        }
        Change::Remove(id) => {
            // A learner never counts; an unknown member is the engine's to refuse.
            if !voters().any(|m| m.id == id) {
                return Ok(());
            }
            let left = || voters().filter(|m| m.id != id);
            (left().count(), left().filter(|m| started(m)).count())
        }
    };
    // etcd lets a one-member cluster add its second member, which then starts.
    if matches!(change, Change::AddVoter | Change::Promote(_)) && total == 2 && up == 1 {
        return Ok(());
    }
    if up < total / 2 + 1 {
        return Err(Refused::NotEnoughStarted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, started: bool, learner: bool) -> Seat {
        Seat {
            id,
            is_learner: learner,
            started,
        }
    }

    #[test]
    fn etcds_quorum_checks_as_a_table() {
        let strict = Reconfig::default();
        let all_up = [member(1, true, false), member(2, true, false), member(3, true, false)];
        let one_down = [member(1, true, false), member(2, true, false), member(3, false, false)];
        let with_learner = [member(1, true, false), member(2, true, true)];
        type Case<'a> = (&'a [Seat], Change, Result<(), Refused>, &'a str);
        let cases: &[Case<'_>] = &[
            (
                &all_up,
                Change::AddVoter,
                Ok(()),
                "four voters, three started: quorum three",
            ),
            (
                &one_down,
                Change::AddVoter,
                Err(Refused::NotEnoughStarted),
                "four voters, two started",
            ),
            (&one_down, Change::Remove(3), Ok(()), "the down member goes: two of two"),
            (
                &one_down,
                Change::Remove(2),
                Err(Refused::NotEnoughStarted),
                "one of two left started",
            ),
            (&all_up, Change::Remove(1), Ok(()), "two of two"),
            (
                &[member(1, true, false)],
                Change::AddVoter,
                Ok(()),
                "a lone member adds its second",
            ),
            (&with_learner, Change::Promote(2), Ok(()), "two voters, both started"),
            (
                &with_learner,
                Change::AddLearner,
                Err(Refused::TooManyLearners),
                "one learner at most",
            ),
            (&with_learner, Change::Remove(2), Ok(()), "a learner never counts"),
            (&all_up, Change::AddLearner, Ok(()), "no learner yet"),
        ];
        for (members, change, want, why) in cases {
            assert_eq!(check(members, *change, strict), *want, "{why}");
        }
    }

    #[test]
    fn without_strict_checks_only_the_learner_limit_holds() {
        let loose = Reconfig {
            strict: false,
            max_learners: 2,
        };
        let one_down = [member(1, true, false), member(2, false, false), member(3, false, false)];
        assert_eq!(check(&one_down, Change::AddVoter, loose), Ok(()));
        assert_eq!(check(&one_down, Change::Remove(1), loose), Ok(()));
        let learners = [member(1, true, false), member(2, true, true), member(3, true, true)];
        assert_eq!(
            check(&learners, Change::AddLearner, loose),
            Err(Refused::TooManyLearners)
        );
    }
}
