//! An executor group on one shared store with an in-process election: the leader runs the
//! procedures, standbys name it, and when its term ends (a lost lease, or a shutdown) a
//! standby takes over, fenced against the old leader, and finishes every procedure.

#[path = "common/bounded.rs"]
mod bounded;

use bounded::Bounded;
use procflow::executor::{Executor, ExecutorError, Outcome};
use procflow::group::{Election, ExecutorGroup, GroupError, LocalElection};
use procflow::prelude::*;
use procflow_store::{MemStore, Store};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// One member's environment: what its handlers did, and the gate that holds `Work`.
struct Env {
    /// (procedure id, the executor's fencing token) per `Work` entered.
    worked: Mutex<Vec<(u64, Option<u64>)>>,
    gate: Semaphore,
}

impl Env {
    fn new(open: bool) -> Arc<Self> {
        Arc::new(Self {
            worked: Mutex::new(Vec::new()),
            gate: Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }),
        })
    }

    fn worked(&self) -> usize {
        self.worked.lock().unwrap().len()
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Move, env = Env)]
enum MoveState {
    #[initial]
    #[transition(to = [Moved])]
    Work,
    #[terminal]
    Moved,
}

#[derive(Serialize, Deserialize)]
struct Move;

impl MoveStateHandlers for Move {
    async fn work(&mut self, ctx: &Context<Env>) -> Step<move_state::Work> {
        let entry = (ctx.id().get(), ctx.fencing_token());
        ctx.env().worked.lock().unwrap().push(entry);
        ctx.env().gate.acquire().await.expect("gate").forget();
        Ok(move_state::Work::Moved.into())
    }
}

/// A member on `store`, whose handlers run with `env`.
fn member(
    election: &LocalElection,
    address: &str,
    store: &Arc<dyn Store>,
    env: &Arc<Env>,
) -> ExecutorGroup<Env> {
    let (store, env) = (Arc::clone(store), Arc::clone(env));
    ExecutorGroup::join(Arc::new(election.candidate(address)), address, move || {
        Executor::builder_shared(Arc::clone(&store), Arc::clone(&env)).register::<MoveState>()
    })
}

/// Polls `check` every 5 ms for up to 10 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Waits until one of `members` leads; returns its index.
async fn leader_of(members: &[&ExecutorGroup<Env>]) -> usize {
    let mut found = None;
    eventually("a leader", || {
        found = members.iter().position(|m| m.term().is_some());
        found.is_some()
    })
    .await;
    found.unwrap()
}

#[tokio::test]
async fn a_standby_takes_over_when_the_leader_loses_its_term_and_the_old_leader_is_fenced() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let election = LocalElection::new();
    let envs = [Env::new(false), Env::new(true), Env::new(true)];
    let first = member(&election, "m0:7000", &store, &envs[0]);
    let leader = first.leading().await;
    let old_term = first.term().unwrap();
    let others = [
        member(&election, "m1:7000", &store, &envs[1]),
        member(&election, "m2:7000", &store, &envs[2]),
    ];

    // Standbys refuse and name the leader.
    for standby in &others {
        match standby.executor().await {
            Err(GroupError::NotLeader { leader }) => {
                assert_eq!(leader.as_deref(), Some("m0:7000"));
            }
            other => panic!("a standby answered {:?}", other.map(|_| ())),
        }
    }
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(leader.submit(Move).await.unwrap());
    }
    // All five are inside `Work` on the old leader, held by its closed gate.
    eventually("five procedures in Work", || envs[0].worked() == 5).await;

    // The old leader's lease is lost: a standby wins the next term and finishes them.
    election.depose();
    let at = leader_of(&[&others[0], &others[1]]).await;
    let new = &others[at];
    let new_term = new.term().unwrap();
    assert!(new_term.token > old_term.token);
    let executor = new.executor().await.unwrap();
    for &id in &ids {
        assert!(matches!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        ));
    }
    let worked = envs[1 + at].worked.lock().unwrap().clone();
    assert_eq!(worked.len(), 5);
    assert!(
        worked
            .iter()
            .all(|(_, token)| *token == Some(new_term.token))
    );
    match first.executor().await {
        Err(GroupError::NotLeader { leader }) => {
            assert_eq!(leader.as_deref(), Some(new.address()));
        }
        other => panic!("the old leader answered {:?}", other.map(|_| ())),
    }

    // The old leader's steps end now; it was stopped, and the store refuses it anyway.
    assert!(
        matches!(leader.halted(), Some(ExecutorError::LeadershipLost(_))),
        "{:?}",
        leader.halted()
    );
    let why = first
        .last_error()
        .expect("the old leader says why it stopped");
    assert!(
        why.to_string().contains("leadership lost") && why.to_string().contains("deposed"),
        "{why}"
    );
    assert!(new.last_error().is_none(), "the new leader is fine");
    envs[0].gate.add_permits(5);
    let before = store.load().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store.load().await.unwrap(),
        before,
        "the old leader wrote nothing"
    );
    for &id in &ids {
        let record = before.records.iter().find(|r| r.id == id.get()).unwrap();
        assert!(record.finished);
    }

    for member in [&first, &others[0], &others[1]] {
        member.shutdown().bounded().await.unwrap();
    }
}

#[tokio::test]
async fn a_leader_that_shuts_down_hands_its_procedures_over() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let election = LocalElection::new();
    let (closed, open) = (Env::new(false), Env::new(true));
    let a = member(&election, "a:1", &store, &closed);
    let leader = a.leading().await;
    let b = member(&election, "b:1", &store, &open);
    let ids = [
        leader.submit(Move).await.unwrap(),
        leader.submit(Move).await.unwrap(),
    ];
    eventually("two procedures in Work", || closed.worked() == 2).await;
    // The shutdown waits for the steps in flight, so let them end after it starts.
    let shutdown = tokio::spawn(async move {
        a.shutdown().bounded().await.unwrap();
        a
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    closed.gate.add_permits(2);
    let a = shutdown.await.unwrap();
    assert!(matches!(a.executor().await, Err(GroupError::ShutDown)));
    let executor = b.leading().await;
    let mut outcomes = HashMap::new();
    for id in ids {
        outcomes.insert(id, executor.wait(id).bounded().await.unwrap());
    }
    assert!(outcomes.values().all(|o| matches!(o, Outcome::Succeeded)));
    b.shutdown().bounded().await.unwrap();
}

#[tokio::test]
async fn terms_of_a_local_election_only_grow_and_resigning_twice_is_harmless() {
    let election = LocalElection::new();
    let a = election.candidate("a");
    let b = election.candidate("b");
    let first = a.campaign().await.unwrap();
    a.resign(first).await.unwrap();
    let second = b.campaign().await.unwrap();
    assert!(second.token > first.token);
    // `a` resigning its old term again must not end `b`'s.
    a.resign(first).await.unwrap();
    assert_eq!(election.current(), Some(second));
    a.lost(first).await; // already over: resolves at once
}

/// The same group on a real 3-member etcd cluster: each member has its own connection, as
/// separate processes would, and the election and the fencing are etcd's.
#[cfg(any(feature = "etcd", all(feature = "postgres", unix)))]
#[path = "../../procflow-store/tests/common/proxy.rs"]
mod proxy;

#[cfg(feature = "etcd")]
mod on_etcd {
    use super::*;
    use procflow::group::EtcdElection;
    use procflow_store::etcd::etcd_client::Client;
    use procflow_store::etcd::{EtcdConfig, EtcdStore, LocalCluster};
    use procflow_store::{Batch, StoreError};

    use super::proxy::Proxy;
    use procflow_store::etcd::etcd_client::{EventType, WatchOptions};
    use std::time::Instant;

    const TTL: Duration = Duration::from_secs(2);

    /// Every change of the leader key from now on, with when it was seen: (time, is a
    /// delete, the key's value, the change's revision).
    type Changes = Arc<Mutex<Vec<(Instant, bool, String, i64)>>>;

    async fn watch_leader_key(config: &EtcdConfig) -> Changes {
        let mut client = client(config).await;
        let now = client
            .get("/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let options = WatchOptions::new().with_start_revision(now + 1);
        let mut stream = client
            .watch(config.leader_key(), Some(options))
            .await
            .unwrap();
        let changes: Changes = Arc::default();
        let seen = Arc::clone(&changes);
        tokio::spawn(async move {
            let _client = client;
            while let Ok(Some(response)) = stream.message().await {
                for event in response.events() {
                    let kv = event.kv().unwrap();
                    seen.lock().unwrap().push((
                        Instant::now(),
                        event.event_type() == EventType::Delete,
                        String::from_utf8_lossy(kv.value()).into_owned(),
                        kv.mod_revision(),
                    ));
                }
            }
        });
        changes
    }

    /// Issue 31: the term's clock starts at the lease grant. A candidate whose link is so
    /// slow that its campaign wins after two thirds of the TTL (its lease may expire
    /// before a keep-alive can renew it) gives the term up instead of leading on it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_etcd_a_campaign_won_too_late_is_given_up_not_led_on() {
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let config = EtcdConfig::new(cluster.endpoints(), "/group/slow-campaign");
        let proxy = Proxy::start(cluster.endpoint(0).parse().unwrap()).await;
        let slow = Client::connect([proxy.endpoint()], None).await.unwrap();
        let changes = watch_leader_key(&config).await;
        let election = Arc::new(EtcdElection::new(slow, &config, "slow:1", TTL));

        // Each way takes 0.6 s: a grant and a campaign take 2.4 s, past the 1.33 s that
        // are safe on a 2 s lease.
        proxy.delay(Duration::from_millis(600));
        let campaign = {
            let election = Arc::clone(&election);
            tokio::spawn(async move { election.campaign().await })
        };
        tokio::time::sleep(Duration::from_secs(8)).await;
        let won_in_etcd = changes
            .lock()
            .unwrap()
            .iter()
            .any(|(_, delete, value, _)| !delete && value == "slow:1");
        assert!(
            won_in_etcd,
            "the slow campaign never created the leader key"
        );
        if campaign.is_finished() {
            let term = campaign.await.unwrap().unwrap();
            panic!(
                "a campaign that won after the lease's safe window led on term {}",
                term.token
            );
        }

        // With the link healed it wins, and keeps its term.
        proxy.heal();
        let term = tokio::time::timeout(Duration::from_secs(10), campaign)
            .await
            .expect("the healed candidate wins")
            .unwrap()
            .unwrap();
        let lost = tokio::time::timeout(3 * TTL, election.lost(term)).await;
        assert!(lost.is_err(), "a healthy term ended: {}", lost.unwrap());
        election.resign(term).await.unwrap();
    }

    /// Issue 31: the links serving the standby's watch go silent without breaking (the
    /// proxies swallow every byte of its open connections), and the leader dies (its own
    /// link swallows everything). The standby's watch would never fire; it notices the
    /// silence, reconnects, and takes over within 2 × TTL + 1 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_etcd_a_standby_whose_watch_went_silent_still_takes_over_in_time() {
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let config = EtcdConfig::new(cluster.endpoints(), "/group/silent-watch");
        let (env_a, env_b) = (Env::new(true), Env::new(true));
        let to_a = Proxy::start(cluster.endpoint(0).parse().unwrap()).await;
        let a = {
            let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
            let via = EtcdConfig::new([to_a.endpoint()], "/group/silent-watch");
            let client = EtcdStore::connect(via.clone()).await.unwrap().client();
            let election = EtcdElection::new(client, &via, "a:1", TTL);
            ExecutorGroup::join(Arc::new(election), "a:1", move || {
                Executor::builder_shared(Arc::clone(&store), Arc::clone(&env_a))
                    .register::<MoveState>()
            })
        };
        a.leading().bounded().await;
        let mut to_b = Vec::new();
        for member in 0..3 {
            to_b.push(Proxy::start(cluster.endpoint(member).parse().unwrap()).await);
        }
        let b = {
            let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
            // A patient client: its connections' own pings would notice the silence only
            // after 10 s.
            let via = EtcdConfig::new(to_b.iter().map(Proxy::endpoint), "/group/silent-watch")
                .request_timeout(Duration::from_secs(10));
            let client = EtcdStore::connect(via.clone()).await.unwrap().client();
            let election = EtcdElection::new(client, &via, "b:1", TTL);
            ExecutorGroup::join(Arc::new(election), "b:1", move || {
                Executor::builder_shared(Arc::clone(&store), Arc::clone(&env_b))
                    .register::<MoveState>()
            })
        };
        // B campaigns, loses, and watches the leader key.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(b.term().is_none());

        let killed = Instant::now();
        to_a.black_hole();
        for proxy in &to_b {
            proxy.black_hole_open();
        }
        tokio::time::timeout(Duration::from_secs(20), b.leading())
            .await
            .expect("the standby took over");
        let takeover = killed.elapsed();
        println!(
            "takeover: {:.2} s (lease ttl {} s)",
            takeover.as_secs_f64(),
            TTL.as_secs()
        );
        assert!(
            takeover <= 2 * TTL + Duration::from_secs(1),
            "the standby took over {takeover:?} after the leader died (lease TTL {TTL:?})"
        );
        to_a.heal();
        for member in [&a, &b] {
            member.shutdown().bounded().await.unwrap();
        }
    }

    /// Issue 31: a leader that loses its term while its lease may still be alive (its
    /// keep-alive answers are lost) resigns it, so the leader key goes at once rather than
    /// when the lease runs out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_etcd_a_lost_term_is_resigned_so_a_standby_wins_without_waiting_for_the_lease() {
        const TTL: Duration = Duration::from_secs(3);
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let config = EtcdConfig::new(cluster.endpoints(), "/group/lost-term");
        let proxy = Proxy::start(cluster.endpoint(0).parse().unwrap()).await;
        let (env_a, env_b) = (Env::new(true), Env::new(true));
        let a = {
            let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
            let slow = Client::connect([proxy.endpoint()], None).await.unwrap();
            let election = EtcdElection::new(slow, &config, "a:1", TTL);
            ExecutorGroup::join(Arc::new(election), "a:1", move || {
                Executor::builder_shared(Arc::clone(&store), Arc::clone(&env_a))
                    .register::<MoveState>()
            })
        };
        let leader = a.leading().await;
        let b = {
            let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
            let client = EtcdStore::connect(config.clone()).await.unwrap().client();
            let election = EtcdElection::new(client, &config, "b:1", TTL);
            ExecutorGroup::join(Arc::new(election), "b:1", move || {
                Executor::builder_shared(Arc::clone(&store), Arc::clone(&env_b))
                    .register::<MoveState>()
            })
        };
        let changes = watch_leader_key(&config).await;
        tokio::time::sleep(TTL).await;

        // A's requests still reach etcd; their answers do not come back.
        proxy.lose_answers();
        let mut lost_at = None;
        eventually("the leader to lose its term", || {
            lost_at = leader.halted().is_some().then(Instant::now);
            lost_at.is_some()
        })
        .await;
        let lost_at = lost_at.unwrap();
        b.leading().bounded().await;
        let deleted_at = changes
            .lock()
            .unwrap()
            .iter()
            .find(|(_, delete, _, _)| *delete)
            .map(|(at, ..)| *at)
            .expect("the leader key was deleted");
        let after = deleted_at.saturating_duration_since(lost_at);
        println!("the leader key went {after:?} after the term was lost (lease TTL {TTL:?})");
        // Left to expire, the lease would live on for two thirds of the TTL (2 s): it was
        // renewed by the last keep-alive, sent a third of the TTL before the term ended.
        assert!(
            after < Duration::from_millis(700),
            "the key went {after:?} after the term was lost: the lease ran out, nobody resigned"
        );
        proxy.heal();
        for member in [&a, &b] {
            member.shutdown().bounded().await.unwrap();
        }
    }

    async fn etcd_member(config: &EtcdConfig, address: &str, env: &Arc<Env>) -> ExecutorGroup<Env> {
        let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
        let client = EtcdStore::connect(config.clone()).await.unwrap().client();
        let election = EtcdElection::new(client, config, address, TTL);
        let env = Arc::clone(env);
        ExecutorGroup::join(Arc::new(election), address, move || {
            Executor::builder_shared(Arc::clone(&store), Arc::clone(&env)).register::<MoveState>()
        })
    }

    async fn client(config: &EtcdConfig) -> Client {
        Client::connect(config.endpoints(), None).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_etcd_a_standby_takes_over_when_the_leaders_key_goes_and_resumes_its_work() {
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let config = EtcdConfig::new(cluster.endpoints(), "/group/takeover");
        let envs = [Env::new(false), Env::new(true), Env::new(true)];
        let first = etcd_member(&config, "m0:7000", &envs[0]).await;
        let leader = first.leading().await;
        let old_term = first.term().unwrap();
        let others = [
            etcd_member(&config, "m1:7000", &envs[1]).await,
            etcd_member(&config, "m2:7000", &envs[2]).await,
        ];
        match others[0].executor().await {
            Err(GroupError::NotLeader { leader }) => assert_eq!(leader.as_deref(), Some("m0:7000")),
            other => panic!("a standby answered {:?}", other.map(|_| ())),
        }
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(leader.submit(Move).await.unwrap());
        }
        eventually("five procedures in Work", || envs[0].worked() == 5).await;

        // The leader key goes (as when its lease expires): the old leader stops, a standby
        // wins a newer term and finishes the five.
        client(&config)
            .await
            .delete(config.leader_key(), None)
            .await
            .unwrap();
        let at = leader_of(&[&others[0], &others[1]]).await;
        let new = &others[at];
        assert!(new.term().unwrap().token > old_term.token);
        let executor = new.executor().await.unwrap();
        for &id in &ids {
            assert!(matches!(
                executor.wait(id).bounded().await.unwrap(),
                Outcome::Succeeded
            ));
        }
        eventually("the old leader to stop", || leader.halted().is_some()).await;
        for member in [&first, &others[0], &others[1]] {
            member.shutdown().bounded().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_etcd_a_replaced_leader_that_did_not_notice_is_fenced_by_etcd_itself() {
        let cluster = LocalCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
        let config = EtcdConfig::new(cluster.endpoints(), "/group/fenced");
        let mut outside = client(&config).await;
        // An old leader: its term is the leader key's create revision. It never hears
        // that it lost (as if paused), so only etcd can stop it.
        let put = outside
            .put(config.leader_key(), "old:1", None)
            .await
            .unwrap();
        let old_token = put.header().unwrap().revision() as u64;
        let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await.unwrap());
        let env = Env::new(false);
        let old = Executor::builder_shared(Arc::clone(&store), Arc::clone(&env))
            .register::<MoveState>()
            .fencing_token(old_token)
            .start()
            .await
            .unwrap();
        let id = old.submit(Move).await.unwrap();
        eventually("the procedure in Work", || env.worked() == 1).await;

        // A new leader takes the key.
        outside.delete(config.leader_key(), None).await.unwrap();
        let put = outside
            .put(config.leader_key(), "new:1", None)
            .await
            .unwrap();
        let new_token = put.header().unwrap().revision() as u64;
        let before = store.load().await.unwrap();

        // The old leader's step ends and tries to persist: etcd refuses, it halts.
        env.gate.add_permits(1);
        eventually("the old leader to halt", || old.halted().is_some()).await;
        match old.halted() {
            Some(ExecutorError::Fenced { token, highest }) => {
                assert_eq!((token, highest), (old_token, new_token));
            }
            other => panic!("halted with {other:?}"),
        }
        assert_eq!(
            store.load().await.unwrap(),
            before,
            "nothing of the old leader landed"
        );
        assert!(
            !before
                .records
                .iter()
                .find(|r| r.id == id.get())
                .unwrap()
                .finished
        );
        // The same batch with the new token goes through.
        let err = store
            .commit(Batch::new().delete(id.get()).with_fencing_token(old_token))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        store
            .commit(Batch::new().delete(id.get()).with_fencing_token(new_token))
            .await
            .unwrap();
    }
}

/// The same group on a real PostgreSQL server: each member has its own connections, as
/// separate processes would, and the election and the fencing are the database's.
#[cfg(all(feature = "postgres", unix))]
mod on_postgres {
    use super::*;
    use procflow::group::PgElection;
    use procflow_store::postgres::{LocalPostgres, PgConfig, PgStore};
    use procflow_store::{Batch, StoreError};
    use std::time::Instant;

    use super::proxy::Proxy;

    const TTL: Duration = Duration::from_secs(2);

    fn server() -> LocalPostgres {
        LocalPostgres::start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// A member whose store and election (lease `ttl`) use `config`, each with
    /// connections of its own.
    async fn pg_member(
        config: &PgConfig,
        address: &str,
        env: &Arc<Env>,
        ttl: Duration,
    ) -> ExecutorGroup<Env> {
        let store: Arc<dyn Store> = Arc::new(PgStore::connect(config.clone()).await.unwrap());
        let election = PgElection::new(config, address, ttl);
        let env = Arc::clone(env);
        ExecutorGroup::join(Arc::new(election), address, move || {
            Executor::builder_shared(Arc::clone(&store), Arc::clone(&env)).register::<MoveState>()
        })
    }

    /// The leader row's term, holder and time left on its lease (ms, 0 once expired).
    async fn leader_row(config: &PgConfig) -> (i64, Option<String>, i64) {
        let client = config.connect().await.unwrap();
        let sql = format!(
            "SELECT term, holder, greatest(0, extract(epoch FROM expires_at - clock_timestamp()) \
             * 1000)::bigint FROM {} WHERE id = 1",
            config.leader_table()
        );
        let row = client.query_one(&sql, &[]).await.unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres_a_leader_that_shuts_down_hands_over_at_once_and_its_work_resumes() {
        let server = server();
        let config = PgConfig::new(server.connection_string(), "group_handover");
        let (closed, open) = (Env::new(false), Env::new(true));
        // A long lease: left to expire, or a standby looking every quarter of it, would
        // take minutes or many seconds.
        let ttl = Duration::from_secs(120);
        let a = pg_member(&config, "a:1", &closed, ttl).await;
        let leader = a.leading().await;
        let b = pg_member(&config, "b:1", &open, ttl).await;
        match b.executor().await {
            Err(GroupError::NotLeader { leader }) => assert_eq!(leader.as_deref(), Some("a:1")),
            other => panic!("a standby answered {:?}", other.map(|_| ())),
        }
        let ids = [
            leader.submit(Move).await.unwrap(),
            leader.submit(Move).await.unwrap(),
        ];
        eventually("two procedures in Work", || closed.worked() == 2).await;
        let old_term = a.term().unwrap();
        // The shutdown waits for the steps in flight, so let them end after it starts.
        let shutdown = tokio::spawn(async move {
            a.shutdown().bounded().await.unwrap();
            a
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        closed.gate.add_permits(2);
        let a = shutdown.await.unwrap();
        let resigned = Instant::now();
        let executor = b.leading().await;
        let took = resigned.elapsed();
        println!("a standby led {took:?} after the leader resigned (lease TTL {ttl:?})");
        // A resigned lease ends at once, and the resignation wakes the standby (NOTIFY):
        // it wins now, not when the lease would have run out nor at its next look.
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(b.term().unwrap().token > old_term.token);
        for id in ids {
            assert!(matches!(
                executor.wait(id).bounded().await.unwrap(),
                Outcome::Succeeded
            ));
        }
        assert!(matches!(a.executor().await, Err(GroupError::ShutDown)));
        b.shutdown().bounded().await.unwrap();
    }

    /// A leader whose renewals get no answer (they may still reach the database) steps
    /// down before its lease can expire, so no standby ever leads while it still thinks
    /// it does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres_a_leader_without_renewals_steps_down_before_its_lease_expires() {
        let server = server();
        let direct = PgConfig::new(server.connection_string(), "group_renewals");
        let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
        let port = proxy.endpoint().rsplit_once(':').unwrap().1.to_owned();
        let proxied = PgConfig::new(
            format!("host=127.0.0.1 port={port} user=procflow dbname=postgres"),
            "group_renewals",
        );
        let (env_a, env_b) = (Env::new(true), Env::new(true));
        let a = {
            let store: Arc<dyn Store> = Arc::new(PgStore::connect(direct.clone()).await.unwrap());
            let election = PgElection::new(&proxied, "a:1", TTL);
            ExecutorGroup::join(Arc::new(election), "a:1", move || {
                Executor::builder_shared(Arc::clone(&store), Arc::clone(&env_a))
                    .register::<MoveState>()
            })
        };
        let leader = a.leading().await;
        // Let a renewal or two go through, so the keeper holds its own connection.
        tokio::time::sleep(TTL).await;
        let b = pg_member(&direct, "b:1", &env_b, TTL).await;
        proxy.black_hole();
        let cut = Instant::now();
        let mut lost_at = None;
        eventually("the leader to step down", || {
            lost_at = leader.halted().is_some().then(Instant::now);
            lost_at.is_some()
        })
        .await;
        let lost_at = lost_at.unwrap();
        let (_, holder, left) = leader_row(&direct).await;
        println!(
            "stepped down {:?} after its link went silent, its lease still {left} ms to run",
            lost_at - cut
        );
        assert_eq!(
            holder.as_deref(),
            Some("a:1"),
            "no one else took the row yet"
        );
        assert!(
            left > 0,
            "the lease had expired before the leader stepped down"
        );
        let why = a.last_error().expect("the old leader says why").to_string();
        assert!(why.contains("no renewal acknowledged in time"), "{why}");
        b.leading().bounded().await;
        proxy.heal();
        for member in [&a, &b] {
            member.shutdown().bounded().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres_a_replaced_leader_that_did_not_notice_is_fenced_by_the_database() {
        let server = server();
        let config = PgConfig::new(server.connection_string(), "group_fenced");
        let store: Arc<dyn Store> = Arc::new(PgStore::connect(config.clone()).await.unwrap());
        let old_election = PgElection::new(&config, "old:1", Duration::from_secs(30));
        let old_term = old_election.campaign().await.unwrap();
        // The old leader never hears that it lost (as if paused): only the database can
        // stop it.
        let env = Env::new(false);
        let old = Executor::builder_shared(Arc::clone(&store), Arc::clone(&env))
            .register::<MoveState>()
            .fencing_token(old_term.token)
            .start()
            .await
            .unwrap();
        let id = old.submit(Move).await.unwrap();
        eventually("the procedure in Work", || env.worked() == 1).await;

        // A new leader takes the row (as after the old lease expired).
        let client = config.connect().await.unwrap();
        let take = format!(
            "UPDATE {} SET term = term + 1, holder = 'new:1' WHERE id = 1 RETURNING term",
            config.leader_table()
        );
        let new_token: i64 = client.query_one(&take, &[]).await.unwrap().get(0);
        let new_token = u64::try_from(new_token).unwrap();
        let before = store.load().await.unwrap();

        // The old leader's step ends and tries to persist: the database refuses, it halts.
        env.gate.add_permits(1);
        eventually("the old leader to halt", || old.halted().is_some()).await;
        match old.halted() {
            Some(ExecutorError::Fenced { token, highest }) => {
                assert_eq!((token, highest), (old_term.token, new_token));
            }
            other => panic!("halted with {other:?}"),
        }
        assert_eq!(
            store.load().await.unwrap(),
            before,
            "nothing of the old leader landed"
        );
        let err = store
            .commit(
                Batch::new()
                    .delete(id.get())
                    .with_fencing_token(old_term.token),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        store
            .commit(Batch::new().delete(id.get()).with_fencing_token(new_token))
            .await
            .unwrap();
        assert_eq!(leader_row(&config).await.1.as_deref(), Some("new:1"));
    }
}
