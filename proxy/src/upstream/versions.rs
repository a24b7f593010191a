//! The etcd version of each member, as its Status answers last said, by member id. The members of a cluster run one
//! version except during an upgrade, one member at a time, when a stream that moves from an upgraded member to one
//! not yet upgraded meets the older rules. Where a rule differs between versions in a way that matters for
//! correctness (what a progress answer promises), it is judged by the version of the member that gave the answer,
//! named in the answer's header, not by what another member said once.

use std::collections::HashMap;
use std::sync::Mutex;

use proto::etcdserverpb::StatusResponse;

use super::etcd_version;

/// The versions the members said, by member id.
#[derive(Default)]
pub struct MemberVersions {
    by_member: Mutex<HashMap<u64, String>>,
}

impl MemberVersions {
    /// Notes the version a member said in its Status answer.
    pub fn record(&self, status: &StatusResponse) {
        let Some(header) = &status.header else { return };
        if header.member_id == 0 || status.version.is_empty() {
            return;
        }
        let mut by_member = self.by_member.lock().unwrap_or_else(|p| p.into_inner());
        if by_member.get(&header.member_id) != Some(&status.version) {
            by_member.insert(header.member_id, status.version.clone());
        }
    }

    /// The version member `member_id` last said, if it said one.
    pub fn of(&self, member_id: u64) -> Option<String> {
        let by_member = self.by_member.lock().unwrap_or_else(|p| p.into_inner());
        by_member.get(&member_id).cloned()
    }

    /// Whether a progress answer of member `member_id` means that every watcher of its stream has received all
    /// events up to the answer's revision: only from etcd 3.5.8, which answers once its watchers are synced (before,
    /// it answers at once, while a watcher resumed from an older revision may still be catching up). A member that
    /// has not said its version is not taken at its word.
    pub fn answers_progress_when_synced(&self, member_id: u64) -> bool {
        let by_member = self.by_member.lock().unwrap_or_else(|p| p.into_inner());
        by_member
            .get(&member_id)
            .is_some_and(|version| !etcd_version::answers_progress_without_watchers(Some(version)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::etcdserverpb::ResponseHeader;

    fn status(member_id: u64, version: &str) -> StatusResponse {
        StatusResponse {
            header: Some(ResponseHeader {
                member_id,
                ..Default::default()
            }),
            version: version.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_progress_answer_is_judged_by_the_version_its_own_member_said() {
        let versions = MemberVersions::default();
        versions.record(&status(1, "3.5.30"));
        versions.record(&status(2, "3.5.1"));
        assert!(versions.answers_progress_when_synced(1));
        assert!(!versions.answers_progress_when_synced(2), "before 3.5.8");
        assert!(!versions.answers_progress_when_synced(3), "never said");
        // Member 2 upgraded, in place (same id).
        versions.record(&status(2, "3.6.4"));
        assert!(versions.answers_progress_when_synced(2));
        assert_eq!(versions.of(2).as_deref(), Some("3.6.4"));
    }

    #[test]
    fn an_answer_without_a_member_or_a_version_teaches_nothing() {
        let versions = MemberVersions::default();
        versions.record(&status(0, "3.5.30"));
        versions.record(&status(4, ""));
        versions.record(&StatusResponse {
            version: "3.5.30".into(),
            ..Default::default()
        });
        assert_eq!(versions.of(0), None);
        assert_eq!(versions.of(4), None);
    }
}
