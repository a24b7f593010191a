package clientv3

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdproxy.test/goclients/harness"
)

// TestAuthTokenRefresh: auth enabled through the client (a root user, and a user with read-write on the test's
// prefix). A client with Username/Password keeps working after its token is invalidated (AuthDisable then
// AuthEnable drops every simple token: its next call gets ErrInvalidAuthToken, and clientv3 authenticates again
// and retries; its watches work with the new token), is refused outside its prefix, and after
// its password is changed can no longer authenticate (ErrAuthFailed) while a client with the new password works. Auth is disabled and the users removed at the end,
// even on failure.
func TestAuthTokenRefresh(t *testing.T) {
	env := harness.Get(t)
	c := env.Client(t)
	pfx := env.Prefix(t)
	ctx := ctxFor(t, 60*time.Second)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	user := enableAuth(t, env, c, pfx)
	var err error
	root := harness.NewClient(t, env.Endpoints, func(cfg *clientv3.Config) { *cfg = withAuth(*cfg, "root", "rootpw") })
	// The user's client talks to one endpoint. Simple tokens are each member's own state, made when that member
	// applies the Authenticate; clientv3 re-authenticates a unary call refused with "invalid auth token" but not a
	// watch (3.7.3's watch.go ends it), so a client spread over etcd's members may have a fresh token's watch land
	// on a member that has not applied its Authenticate yet, and fail directly on etcd. Through the proxy there is
	// one endpoint per proxy anyway.
	u := harness.NewClient(t, env.Endpoints[:1], func(cfg *clientv3.Config) { *cfg = withAuth(*cfg, user, "pw1") })
	key := pfx + "k"
	mustPut(t, u, key, "1")
	if _, err := u.Put(ctx, "/goclients-outside-"+env.Name(), "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("put outside the user's prefix: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
	// Without credentials a client is refused.
	if _, err := c.Get(ctx, key); !errors.Is(err, rpctypes.ErrUserEmpty) && !errors.Is(err, rpctypes.ErrInvalidAuthToken) {
		t.Fatalf("get without credentials under auth: %v, want %v", err, rpctypes.ErrUserEmpty)
	}

	// Invalidate every token: the user's client authenticates again by itself.
	_, err = root.AuthDisable(ctx)
	must("auth disable", err)
	_, err = root.AuthEnable(ctx)
	must("auth enable again", err)
	mustPut(t, u, key, "2")
	if v, _ := getValue(t, u, key); v != "2" {
		t.Fatalf("the user reads %q after re-authenticating, want 2", v)
	}
	// Its watch works too, with the new token. (Not as the first call after the tokens are dropped: clientv3 does
	// not authenticate again for a watch.)
	wctx := ctxFor(t, 20*time.Second)
	wch := u.Watch(wctx, key, clientv3.WithCreatedNotify())
	if resp := <-wch; !resp.Created || resp.Err() != nil {
		t.Fatalf("the user's watch: %+v (err %v), want created", resp, resp.Err())
	}
	rev := mustPut(t, root, key, "3")
	if resp := <-wch; len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != rev {
		t.Fatalf("the user's watch: %+v (err %v), want root's put at %d", resp, resp.Err(), rev)
	}

	// A password change invalidates the user's token; the old password no longer authenticates.
	_, err = root.UserChangePassword(ctx, user, "pw2")
	must("change password", err)
	if _, err := u.Put(ctx, key, "4"); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("put by the client with the old password: %v, want %v", err, rpctypes.ErrAuthFailed)
	}
	u2 := harness.NewClient(t, env.Endpoints, func(cfg *clientv3.Config) { *cfg = withAuth(*cfg, user, "pw2") })
	mustPut(t, u2, key, "5")
	if v, _ := getValue(t, root, key); v != "5" {
		t.Fatalf("root reads %q, want 5", v)
	}
}

// enableAuth adds a root user (password rootpw) and a user (password pw1) with read-write on pfx, and enables
// auth through c; auth is disabled and the users and role removed when the test ends, even on failure. It returns
// the user's name.
func enableAuth(t *testing.T, env *harness.Env, c *clientv3.Client, pfx string) string {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	user, role := "goclients-user", "goclients-rw"
	must("add root", ignoreExists(c.UserAdd(ctx, "root", "rootpw")))
	must("grant root", ignore(c.UserGrantRole(ctx, "root", "root")))
	must("add user", ignoreExists(c.UserAdd(ctx, user, "pw1")))
	must("add role", ignoreExists(c.RoleAdd(ctx, role)))
	must("grant permission", ignore(c.RoleGrantPermission(ctx, role, pfx, clientv3.GetPrefixRangeEnd(pfx), clientv3.PermissionType(clientv3.PermReadWrite))))
	must("grant role", ignore(c.UserGrantRole(ctx, user, role)))
	// Disable auth and remove the users with the root user, whatever happens.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		root, err := clientv3.New(withAuth(harness.Config(env.Endpoints), "root", "rootpw"))
		if err == nil {
			if _, err := root.AuthDisable(ctx); err != nil {
				t.Errorf("cleanup: auth disable as root: %v", err)
			}
			_ = root.Close()
		} else {
			t.Errorf("cleanup: root client: %v", err)
		}
		plain, err := clientv3.New(harness.Config(env.Endpoints))
		if err != nil {
			t.Errorf("cleanup: client: %v", err)
			return
		}
		defer plain.Close()
		for _, u := range []string{user, "root"} {
			_, _ = plain.UserDelete(ctx, u)
		}
		_, _ = plain.RoleDelete(ctx, role)
	})
	if _, err := c.AuthEnable(ctx); err != nil {
		t.Fatalf("auth enable: %v", err)
	}
	return user
}

// TestKeepAliveAcrossTokenInvalidation: under auth, a user's KeepAlive keeps its lease alive after every token is
// dropped (AuthDisable then AuthEnable): keepalive answers still arrive more than the TTL later, and the lease and
// its key live on.
func TestKeepAliveAcrossTokenInvalidation(t *testing.T) {
	env := harness.Get(t)
	c := env.Client(t)
	pfx := env.Prefix(t)
	user := enableAuth(t, env, c, pfx)
	root := harness.NewClient(t, env.Endpoints, func(cfg *clientv3.Config) { *cfg = withAuth(*cfg, "root", "rootpw") })
	// The user's client talks to one endpoint. Simple tokens are each member's own state, made when that member
	// applies the Authenticate; clientv3 re-authenticates a unary call refused with "invalid auth token" but not a
	// watch (3.7.3's watch.go ends it), so a client spread over etcd's members may have a fresh token's watch land
	// on a member that has not applied its Authenticate yet, and fail directly on etcd. Through the proxy there is
	// one endpoint per proxy anyway.
	u := harness.NewClient(t, env.Endpoints[:1], func(cfg *clientv3.Config) { *cfg = withAuth(*cfg, user, "pw1") })
	const ttl = 3
	grant, err := u.Grant(ctxFor(t, 10*time.Second), ttl)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	key := pfx + "k"
	if _, err := u.Put(ctxFor(t, 10*time.Second), key, "v", clientv3.WithLease(grant.ID)); err != nil {
		t.Fatalf("put under the lease: %v", err)
	}
	kch, err := u.KeepAlive(ctxFor(t, 60*time.Second), grant.ID)
	if err != nil {
		t.Fatalf("keepalive: %v", err)
	}
	select {
	case ka := <-kch:
		if ka == nil || ka.TTL <= 0 {
			t.Fatalf("first keepalive: %v", ka)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no first keepalive answer")
	}
	if _, err := root.AuthDisable(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("auth disable: %v", err)
	}
	if _, err := root.AuthEnable(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("auth enable: %v", err)
	}
	dropped := time.Now()
	waitRenewedPast(t, kch, dropped, ttl, "the tokens were dropped")
	ttlResp, err := root.TimeToLive(ctxFor(t, 10*time.Second), grant.ID)
	if err != nil {
		t.Fatalf("time to live after the tokens were dropped: %v", err)
	}
	if ttlResp.TTL <= 0 {
		t.Fatalf("lease %x TTL %d %v after the tokens were dropped: it expired",
			grant.ID, ttlResp.TTL, time.Since(dropped).Round(time.Millisecond))
	}
	if v, ok := getValue(t, u, key); !ok || v != "v" {
		t.Fatalf("the key under the lease: %q %v", v, ok)
	}
}

func withAuth(cfg clientv3.Config, user, password string) clientv3.Config {
	cfg.Username, cfg.Password = user, password
	return cfg
}

func ignore[T any](_ T, err error) error { return err }

// ignoreExists passes an error but "already exists" (the user or role of an earlier, failed run).
func ignoreExists[T any](_ T, err error) error {
	if errors.Is(err, rpctypes.ErrUserAlreadyExist) || errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return nil
	}
	return err
}
