//! etcd's auth as the model keeps it, by the rules of etcd 3.5.30's auth store: whether auth is on, the auth
//! revision, users with their passwords and roles, roles with their key permissions, and each member's simple
//! tokens.
//!
//! Tokens are etcd's simple tokens: `<16 letters>.<index>`, assigned on every member (Authenticate goes through
//! raft), kept in each member's memory only (a member that crashes forgets them all; one that was down when a
//! token was issued learns it when it replays the log), and forgotten by a member after `--auth-token-ttl` without
//! use there (every use on a member renews it on that member only). Passwords are kept as given: the model has no
//! bcrypt cost to pay.
//!
//! Simplified: a member cut off from the others knows a token as soon as it is issued (etcd's would wait for the
//! log entry, and refuse the token meanwhile); "revision of auth store is old" never happens (it needs a change of
//! auth between a request's proposal and its application).

use std::collections::BTreeMap;
use std::time::Duration;

use proto::authpb::Permission;
use proto::authpb::permission::Type as PermissionType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Status;

use super::errors;

/// etcd's default `--auth-token-ttl`.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(300);

/// The user and the role that may do anything.
const ROOT: &str = "root";

/// The letters of a simple token's random part (etcd's `letters`).
const TOKEN_LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
const TOKEN_LETTERS_LEN: usize = 16;

/// What a request wants to do to a key range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Who a request comes from, as the member it reached sees its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Auth is off: anyone may do anything.
    Anyone,
    /// Auth is on and the request carries no token.
    Nobody,
    User(String),
}

struct User {
    /// `None`: a user added with `no_password`, who cannot authenticate.
    password: Option<String>,
    /// Sorted, as etcd keeps them.
    roles: Vec<String>,
}

struct Token {
    user: String,
    expires_at: Duration,
}

/// The auth state of the model cluster.
pub struct Auth {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    /// Each role's permissions, sorted by key as etcd keeps them.
    roles: BTreeMap<String, Vec<Permission>>,
    /// Per member: the tokens it knows.
    tokens: Vec<BTreeMap<String, Token>>,
    token_ttl: Duration,
    /// Stands for the raft index of the Authenticate entry in a token.
    tokens_issued: u64,
    token_letters: StdRng,
}

impl Auth {
    /// The auth state of a new cluster of `members` members: off, no users, no roles, revision 1 (etcd commits
    /// its first auth revision when it creates the store).
    pub fn new(members: usize, seed: u64) -> Self {
        Self {
            enabled: false,
            revision: 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            tokens: (0..members).map(|_| BTreeMap::new()).collect(),
            token_ttl: DEFAULT_TOKEN_TTL,
            tokens_issued: 0,
            token_letters: StdRng::seed_from_u64(seed),
        }
    }

    /// etcd's `--auth-token-ttl`.
    pub fn set_token_ttl(&mut self, ttl: Duration) {
        self.token_ttl = ttl;
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Member `member` crashed: it forgets every token.
    pub fn forget_tokens(&mut self, member: usize) {
        self.tokens[member].clear();
    }

    /// Who a request with `token` reaching member `member` at `now` comes from. A token the member does not know
    /// (never issued, forgotten in a crash, unused for the token TTL) is refused; a known one is renewed there.
    pub fn caller(
        &mut self,
        member: usize,
        token: Option<&str>,
        now: Duration,
    ) -> Result<Caller, Status> {
        if !self.enabled {
            return Ok(Caller::Anyone);
        }
        let Some(token) = token else {
            return Ok(Caller::Nobody);
        };
        let known = &mut self.tokens[member];
        match known.get_mut(token) {
            Some(entry) if entry.expires_at > now => {
                entry.expires_at = now + self.token_ttl;
                Ok(Caller::User(entry.user.clone()))
            }
            Some(_) => {
                known.remove(token);
                Err(errors::invalid_auth_token())
            }
            None => Err(errors::invalid_auth_token()),
        }
    }

    /// Whether `caller` may `access` the range `key`..`range_end` (etcd's rules: an empty `range_end` is the key
    /// alone, `"\0"` everything from `key` on).
    pub fn check(
        &self,
        caller: &Caller,
        access: Access,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), Status> {
        let name = match caller {
            Caller::Anyone => return Ok(()),
            Caller::Nobody => return Err(errors::user_empty()),
            Caller::User(name) => name,
        };
        let Some(user) = self.users.get(name) else {
            return Err(errors::permission_denied());
        };
        if user.roles.iter().any(|role| role == ROOT) {
            return Ok(());
        }
        let granted: Vec<Span> = user
            .roles
            .iter()
            .filter_map(|role| self.roles.get(role))
            .flatten()
            .filter(|perm| grants(perm.perm_type, access))
            .map(|perm| Span::of_permission(&perm.key, &perm.range_end))
            .collect();
        let permitted = if range_end.is_empty() {
            granted.iter().any(|span| span.contains(key))
        } else {
            covers(granted, &Span::of_request(key, range_end))
        };
        permitted
            .then_some(())
            .ok_or_else(errors::permission_denied)
    }

    /// Whether `caller` may manage auth (has the root role), as etcd's `IsAdminPermitted` decides.
    pub fn check_admin(&self, caller: &Caller) -> Result<(), Status> {
        match caller {
            Caller::Anyone => Ok(()),
            Caller::Nobody => Err(errors::user_empty()),
            Caller::User(name) => match self.users.get(name) {
                None => Err(errors::user_not_found()),
                Some(user) if user.roles.iter().any(|role| role == ROOT) => Ok(()),
                Some(_) => Err(errors::permission_denied()),
            },
        }
    }

    pub fn enable(&mut self) -> Result<(), Status> {
        if self.enabled {
            return Ok(());
        }
        let root = self
            .users
            .get(ROOT)
            .ok_or_else(errors::root_user_not_exist)?;
        if !root.roles.iter().any(|role| role == ROOT) {
            return Err(errors::root_role_not_exist());
        }
        self.enabled = true;
        Ok(())
    }

    pub fn disable(&mut self) {
        if !self.enabled {
            return;
        }
        self.enabled = false;
        self.revision += 1;
        self.tokens.iter_mut().for_each(BTreeMap::clear);
    }

    /// Checks `name`'s password and issues a token every member knows from `now`.
    pub fn authenticate(
        &mut self,
        name: &str,
        password: &str,
        now: Duration,
    ) -> Result<String, Status> {
        if !self.enabled {
            return Err(errors::auth_not_enabled());
        }
        match self.users.get(name) {
            Some(User {
                password: Some(expected),
                ..
            }) if expected == password => {}
            _ => return Err(errors::auth_failed()),
        }
        self.tokens_issued += 1;
        let letters: String = (0..TOKEN_LETTERS_LEN)
            .map(|_| TOKEN_LETTERS[self.token_letters.random_range(0..TOKEN_LETTERS.len())] as char)
            .collect();
        let token = format!("{letters}.{}", self.tokens_issued);
        for known in &mut self.tokens {
            known.insert(
                token.clone(),
                Token {
                    user: name.to_string(),
                    expires_at: now + self.token_ttl,
                },
            );
        }
        Ok(token)
    }

    pub fn user_add(
        &mut self,
        name: &str,
        password: &str,
        no_password: bool,
    ) -> Result<(), Status> {
        if name.is_empty() {
            return Err(errors::user_empty());
        }
        if self.users.contains_key(name) {
            return Err(errors::user_already_exist());
        }
        let password = (!no_password).then(|| password.to_string());
        self.users.insert(
            name.to_string(),
            User {
                password,
                roles: Vec::new(),
            },
        );
        self.revision += 1;
        Ok(())
    }

    pub fn user_delete(&mut self, name: &str) -> Result<(), Status> {
        if self.enabled && name == ROOT {
            return Err(errors::invalid_auth_mgmt());
        }
        self.users.remove(name).ok_or_else(errors::user_not_found)?;
        self.revision += 1;
        self.forget_user_tokens(name);
        Ok(())
    }

    pub fn user_change_password(&mut self, name: &str, password: &str) -> Result<(), Status> {
        let user = self
            .users
            .get_mut(name)
            .ok_or_else(errors::user_not_found)?;
        if user.password.is_some() {
            user.password = Some(password.to_string());
        }
        self.revision += 1;
        self.forget_user_tokens(name);
        Ok(())
    }

    pub fn user_grant_role(&mut self, name: &str, role: &str) -> Result<(), Status> {
        if !self.users.contains_key(name) {
            return Err(errors::user_not_found());
        }
        if role != ROOT && !self.roles.contains_key(role) {
            return Err(errors::role_not_found());
        }
        let roles = &mut self.users.get_mut(name).expect("checked above").roles;
        if let Err(at) = roles.binary_search_by(|r| r.as_str().cmp(role)) {
            roles.insert(at, role.to_string());
            self.revision += 1;
        }
        Ok(())
    }

    pub fn user_revoke_role(&mut self, name: &str, role: &str) -> Result<(), Status> {
        if self.enabled && name == ROOT && role == ROOT {
            return Err(errors::invalid_auth_mgmt());
        }
        let user = self
            .users
            .get_mut(name)
            .ok_or_else(errors::user_not_found)?;
        let before = user.roles.len();
        user.roles.retain(|r| r != role);
        if user.roles.len() == before {
            return Err(errors::role_not_granted());
        }
        self.revision += 1;
        Ok(())
    }

    /// `name`'s roles, for `caller`: an admin, or the user itself.
    pub fn user_get(&self, caller: &Caller, name: &str) -> Result<Vec<String>, Status> {
        if let Err(refused) = self.check_admin(caller)
            && *caller != Caller::User(name.to_string())
        {
            return Err(refused);
        }
        self.users
            .get(name)
            .map(|user| user.roles.clone())
            .ok_or_else(errors::user_not_found)
    }

    pub fn user_list(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    pub fn role_add(&mut self, name: &str) -> Result<(), Status> {
        if name.is_empty() {
            return Err(errors::role_empty());
        }
        if self.roles.contains_key(name) {
            return Err(errors::role_already_exist());
        }
        self.roles.insert(name.to_string(), Vec::new());
        self.revision += 1;
        Ok(())
    }

    pub fn role_delete(&mut self, name: &str) -> Result<(), Status> {
        if self.enabled && name == ROOT {
            return Err(errors::invalid_auth_mgmt());
        }
        self.roles.remove(name).ok_or_else(errors::role_not_found)?;
        for user in self.users.values_mut() {
            user.roles.retain(|r| r != name);
        }
        self.revision += 1;
        Ok(())
    }

    pub fn role_grant_permission(
        &mut self,
        name: &str,
        perm: Option<Permission>,
    ) -> Result<(), Status> {
        let perm = perm.ok_or_else(errors::permission_not_given)?;
        if !is_valid_permission_range(&perm.key, &perm.range_end) {
            return Err(errors::invalid_auth_mgmt());
        }
        let perms = self
            .roles
            .get_mut(name)
            .ok_or_else(errors::role_not_found)?;
        match perms
            .iter_mut()
            .find(|p| p.key == perm.key && p.range_end == perm.range_end)
        {
            Some(existing) => existing.perm_type = perm.perm_type,
            None => {
                let at = perms.partition_point(|p| p.key <= perm.key);
                perms.insert(at, perm);
            }
        }
        self.revision += 1;
        Ok(())
    }

    pub fn role_revoke_permission(
        &mut self,
        name: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), Status> {
        let perms = self
            .roles
            .get_mut(name)
            .ok_or_else(errors::role_not_found)?;
        let before = perms.len();
        perms.retain(|p| !(p.key == key && p.range_end == range_end));
        if perms.len() == before {
            return Err(errors::permission_not_granted());
        }
        self.revision += 1;
        Ok(())
    }

    /// `name`'s permissions, for `caller`: an admin, or a user who has the role.
    pub fn role_get(&self, caller: &Caller, name: &str) -> Result<Vec<Permission>, Status> {
        if let Err(refused) = self.check_admin(caller) {
            let has_role = matches!(caller, Caller::User(user)
                if self.users.get(user).is_some_and(|u| u.roles.iter().any(|r| r == name)));
            if !has_role {
                return Err(refused);
            }
        }
        self.roles
            .get(name)
            .cloned()
            .ok_or_else(errors::role_not_found)
    }

    pub fn role_list(&self) -> Vec<String> {
        self.roles.keys().cloned().collect()
    }

    fn forget_user_tokens(&mut self, name: &str) {
        for known in &mut self.tokens {
            known.retain(|_, token| token.user != name);
        }
    }
}

/// The range etcd 3.5's auth checks for a watcher of `key`..`range_end`: an empty key is `"\0"`, and a watch from
/// a key on (`range_end` `"\0"`) is checked as the key alone (etcd's watch server empties that end before its
/// permission check).
pub fn watch_checked_range(key: &[u8], range_end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let key = if key.is_empty() {
        vec![0]
    } else {
        key.to_vec()
    };
    let range_end = if range_end == [0] {
        Vec::new()
    } else {
        range_end.to_vec()
    };
    (key, range_end)
}

/// Whether a permission of `perm_type` (the proto's number) grants `access`.
fn grants(perm_type: i32, access: Access) -> bool {
    match PermissionType::try_from(perm_type) {
        Ok(PermissionType::Readwrite) => true,
        Ok(PermissionType::Read) => access == Access::Read,
        Ok(PermissionType::Write) => access == Access::Write,
        Err(_) => false,
    }
}

/// etcd's `isValidPermissionRange`: a key, and no end, an end above the key, or `"\0"` (everything from the key).
fn is_valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || key < range_end || range_end == [0])
}

/// A half-open key interval; `end: None` has no upper bound.
#[derive(Debug)]
struct Span {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Span {
    /// The keys a permission grants: its key alone when it has no end.
    fn of_permission(key: &[u8], range_end: &[u8]) -> Self {
        let end = match range_end {
            [] => Some([key, &[0]].concat()),
            [0] => None,
            end => Some(end.to_vec()),
        };
        Self {
            start: key.to_vec(),
            end,
        }
    }

    /// The keys a request with a non-empty `range_end` names.
    fn of_request(key: &[u8], range_end: &[u8]) -> Self {
        Self {
            start: key.to_vec(),
            end: (range_end != [0]).then(|| range_end.to_vec()),
        }
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.start.as_slice() <= key && self.end.as_deref().is_none_or(|end| key < end)
    }
}

/// Whether the union of `granted` covers all of `wanted`.
fn covers(mut granted: Vec<Span>, wanted: &Span) -> bool {
    granted.sort_by(|a, b| a.start.cmp(&b.start));
    // Everything below `reached` (from `wanted.start`) is covered so far.
    let mut reached = wanted.start.clone();
    for span in granted {
        if span.start > reached {
            break;
        }
        match span.end {
            None => return true,
            Some(end) if end > reached => reached = end,
            Some(_) => {}
        }
        if wanted.end.as_ref().is_some_and(|end| &reached >= end) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(perm_type: PermissionType, key: &str, range_end: &str) -> Permission {
        Permission {
            perm_type: perm_type as i32,
            key: key.into(),
            range_end: range_end.into(),
        }
    }

    /// Auth on, with root and `alice`, who holds `perms` through one role.
    fn with_alice(perms: &[Permission]) -> Auth {
        let mut auth = Auth::new(2, 1);
        auth.user_add("root", "rootpw", false).unwrap();
        auth.user_grant_role("root", "root").unwrap();
        auth.user_add("alice", "pw", false).unwrap();
        auth.role_add("r").unwrap();
        for p in perms {
            auth.role_grant_permission("r", Some(p.clone())).unwrap();
        }
        auth.user_grant_role("alice", "r").unwrap();
        auth.enable().unwrap();
        auth
    }

    #[test]
    fn a_range_is_permitted_only_when_the_granted_spans_cover_all_of_it() {
        let auth = with_alice(&[
            perm(PermissionType::Read, "a", "c"),
            perm(PermissionType::Readwrite, "c", "e"),
            perm(PermissionType::Read, "x", ""),
            perm(PermissionType::Write, "w", "\0"),
        ]);
        let alice = Caller::User("alice".into());
        let read =
            |key: &str, end: &str| auth.check(&alice, Access::Read, key.as_bytes(), end.as_bytes());
        let write = |key: &str, end: &str| {
            auth.check(&alice, Access::Write, key.as_bytes(), end.as_bytes())
        };
        assert!(read("a", "e").is_ok(), "two adjacent spans cover a..e");
        assert!(read("b", "").is_ok());
        assert!(
            read("x", "").is_ok(),
            "a key-only permission grants that key"
        );
        assert_eq!(
            read("x", "y").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert!(read("a", "f").is_err(), "e..f is not granted");
        assert!(read("e", "").is_err());
        assert!(write("a", "").is_err(), "read does not grant write");
        assert!(write("d", "").is_ok(), "readwrite grants write");
        assert!(
            write("w", "\0").is_ok() && write("zzz", "").is_ok(),
            "open-ended write from w"
        );
        assert!(read("w", "").is_err(), "write does not grant read");
        let root = Caller::User("root".into());
        assert!(auth.check(&root, Access::Write, b"anything", b"\0").is_ok());
        assert_eq!(
            auth.check(&Caller::Nobody, Access::Read, b"a", b"")
                .unwrap_err()
                .message(),
            "etcdserver: user name is empty"
        );
    }

    #[test]
    fn tokens_live_per_member_expire_unused_and_die_with_a_crash() {
        let mut auth = with_alice(&[]);
        auth.set_token_ttl(Duration::from_secs(10));
        let t0 = Duration::from_secs(100);
        let token = auth.authenticate("alice", "pw", t0).unwrap();
        assert!(
            token
                .split_once('.')
                .is_some_and(|(letters, index)| letters.len() == 16 && index == "1")
        );
        // Used on member 0 at +8 s: renewed there only.
        assert!(
            auth.caller(0, Some(&token), t0 + Duration::from_secs(8))
                .is_ok()
        );
        let later = t0 + Duration::from_secs(12);
        assert_eq!(
            auth.caller(0, Some(&token), later).unwrap(),
            Caller::User("alice".into())
        );
        assert_eq!(
            auth.caller(1, Some(&token), later).unwrap_err().message(),
            "etcdserver: invalid auth token"
        );
        auth.forget_tokens(0);
        assert!(auth.caller(0, Some(&token), later).is_err());
        assert_eq!(
            auth.authenticate("alice", "wrong", later)
                .unwrap_err()
                .message(),
            "etcdserver: authentication failed, invalid user ID or password"
        );
    }

    #[test]
    fn auth_needs_root_with_the_root_role_and_protects_it_once_on() {
        let mut auth = Auth::new(1, 1);
        assert_eq!(
            auth.enable().unwrap_err().message(),
            "etcdserver: root user does not exist"
        );
        auth.user_add("root", "pw", false).unwrap();
        assert_eq!(
            auth.enable().unwrap_err().message(),
            "etcdserver: root user does not have root role"
        );
        auth.role_add("root").unwrap();
        auth.user_grant_role("root", "root").unwrap();
        assert_eq!(auth.revision(), 4);
        auth.enable().unwrap();
        assert_eq!(
            auth.revision(),
            4,
            "enabling does not move the auth revision"
        );
        assert!(auth.user_delete("root").is_err());
        assert!(auth.user_revoke_role("root", "root").is_err());
        assert!(auth.role_delete("root").is_err());
        auth.disable();
        assert_eq!(auth.revision(), 5);
        assert_eq!(
            auth.caller(0, Some("any.1"), Duration::ZERO).unwrap(),
            Caller::Anyone
        );
    }
}
