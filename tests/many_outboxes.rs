//! Several outbox tables through one relay, one slot and one publication (`[[outbox]]`
//! with `[outbox_defaults]`), against a real PostgreSQL: each table's rows are routed by
//! its own rules, the server runs one WAL sender for all of them, a table that leaves
//! the publication stops the relay naming that table (nothing acknowledged past it),
//! and `backfill --table`, `check`, `init` and `slot status` know every table.

use outbox_relay_harness as support;

use std::collections::BTreeMap;

use serde_json::Value;
use support::outbox::{cluster_with_app_db, plain, with_metrics, OUTBOX_SQL, SLOT, WAIT};
use support::{PgCluster, RelayProcess};

/// The tables: Debezium's default in `public`, two tenants' copies.
const TABLES: [&str; 3] = ["public.outbox", "tenant_a.outbox", "tenant_b.outbox"];

fn cluster_with_three_outboxes() -> PgCluster {
    let pg = cluster_with_app_db();
    let mut client = pg.client_db("app");
    client.batch_execute(OUTBOX_SQL).expect("public.outbox");
    client
        .batch_execute(
            "CREATE SCHEMA tenant_a; CREATE TABLE tenant_a.outbox (LIKE public.outbox INCLUDING ALL);
             CREATE SCHEMA tenant_b; CREATE TABLE tenant_b.outbox (LIKE public.outbox INCLUDING ALL);",
        )
        .expect("the tenants' outboxes");
    pg
}

/// Shared defaults (route by `type`), tenant_b with a topic of its own.
fn config(pg: &PgCluster) -> String {
    format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [outbox_defaults]\nroute_by_column = \"type\"\ntopic = \"shared.${{routedByValue}}\"\n\
         [[outbox]]\ntable = \"public.outbox\"\n\
         [[outbox]]\ntable = \"tenant_a.outbox\"\n\
         [[outbox]]\ntable = \"tenant_b.outbox\"\ntopic = \"b.${{routedByValue}}\"\n\
         [sink]\ntype = \"stdout\"\n",
        pg.url("postgres", None, "app")
    )
}

/// Inserts one event into `table` in its own transaction; its id.
fn insert(pg: &PgCluster, table: &str, kind: &str) -> String {
    pg.client_db("app")
        .query_one(
            &format!(
                "INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
                 VALUES ('order', 'o-1', $1, '{{}}') RETURNING id::text"
            ),
            &[&kind],
        )
        .unwrap_or_else(|e| panic!("inserting into {table}: {e}"))
        .get(0)
}

/// Event id → topic of stdout-sink lines.
fn topics(lines: &[String]) -> BTreeMap<String, String> {
    lines
        .iter()
        .map(|line| {
            let event: Value = serde_json::from_str(line).expect("a JSON line");
            (
                event["headers"]["id"].as_str().expect("an id").to_owned(),
                event["topic"].as_str().expect("a topic").to_owned(),
            )
        })
        .collect()
}

fn count(pg: &PgCluster, sql: &str) -> i64 {
    pg.client_db("app").query_one(sql, &[]).expect(sql).get(0)
}

#[test]
fn three_outboxes_stream_through_one_slot_each_routed_by_its_own_rules() {
    let pg = cluster_with_three_outboxes();
    let (config, port) = with_metrics(&config(&pg));
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);

    // The relay made one publication of the three tables and one slot.
    assert_eq!(
        count(
            &pg,
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_relay'"
        ),
        3
    );
    assert_eq!(count(&pg, "SELECT count(*) FROM pg_replication_slots"), 1);

    let mut expected = BTreeMap::new();
    expected.insert(
        insert(&pg, TABLES[0], "Created"),
        "shared.Created".to_owned(),
    );
    expected.insert(insert(&pg, TABLES[1], "Paid"), "shared.Paid".to_owned());
    expected.insert(insert(&pg, TABLES[2], "Shipped"), "b.Shipped".to_owned());
    // One transaction writing to two outboxes: both events, each by its table's rules.
    let mut client = pg.client_db("app");
    let mut txn = client.transaction().unwrap();
    let a: String = txn
        .query_one(
            "INSERT INTO tenant_a.outbox (aggregatetype, aggregateid, type, payload)
             VALUES ('order', 'o-2', 'Refunded', '{}') RETURNING id::text",
            &[],
        )
        .unwrap()
        .get(0);
    let b: String = txn
        .query_one(
            "INSERT INTO tenant_b.outbox (aggregatetype, aggregateid, type, payload)
             VALUES ('order', 'o-2', 'Refunded', '{}') RETURNING id::text",
            &[],
        )
        .unwrap()
        .get(0);
    txn.commit().unwrap();
    expected.insert(a, "shared.Refunded".to_owned());
    expected.insert(b, "b.Refunded".to_owned());

    let lines = relay.wait_for_lines(expected.len(), WAIT);
    assert_eq!(
        topics(&lines),
        expected,
        "every event, by its table's rules"
    );

    // One WAL sender decodes for all three tables.
    assert_eq!(
        count(
            &pg,
            "SELECT count(*) FROM pg_stat_replication WHERE application_name LIKE 'outbox-relay%'"
        ),
        1
    );
    for (table, events) in [(TABLES[0], 1), (TABLES[1], 2), (TABLES[2], 2)] {
        relay.wait_metric(
            port,
            &format!("outbox_relay_outbox_events_total{{outbox=\"{table}\"}}"),
            "the events read from each outbox table",
            WAIT,
            |n| n == events,
        );
    }

    // slot status lists every table as published.
    let (status, stdout, stderr) = support::relay::run_command(&["slot", "status"], &config, WAIT);
    assert!(status.success(), "{stderr}");
    for table in TABLES {
        assert!(stdout.contains(&format!("{table} (published)")), "{stdout}");
    }
}

#[test]
fn a_table_leaving_the_publication_stops_the_relay_naming_it_and_backfill_sends_its_rows() {
    let pg = cluster_with_three_outboxes();
    let config = config(&pg);
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let first = insert(&pg, TABLES[2], "Created");
    let after_first = pg.current_wal_lsn();
    assert_eq!(topics(&relay.wait_for_lines(1, WAIT)).len(), 1);
    support::wait_until("the first row is acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= after_first
    });

    pg.client_db("app")
        .batch_execute("ALTER PUBLICATION outbox_relay DROP TABLE tenant_b.outbox")
        .unwrap();
    let after_change = pg.current_wal_lsn();
    let unseen = insert(&pg, TABLES[2], "Lost");
    // The other tables still stream until the watch sees the change; traffic elsewhere
    // moves the WAL on.
    insert(&pg, TABLES[0], "Other");

    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "the relay stops");
    let stderr = plain(&relay.stderr());
    assert!(
        stderr.contains("removed from the publication"),
        "names the change: {stderr}"
    );
    assert!(
        stderr.contains("ALTER PUBLICATION \"outbox_relay\" ADD TABLE \"tenant_b\".\"outbox\""),
        "gives the repair for that table: {stderr}"
    );
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(u64::MAX);
    assert!(
        confirmed <= after_change,
        "acknowledged {} past the change at {}",
        support::u64_to_lsn(confirmed),
        support::u64_to_lsn(after_change)
    );
    drop(relay);

    // check says what is wrong before a restart.
    let (status, stdout, stderr) = support::relay::run_command(&["check"], &config, WAIT);
    assert!(!status.success(), "check fails: {stdout}{stderr}");
    let said = plain(&format!("{stdout}{stderr}"));
    assert!(
        said.contains("does not include the outbox table tenant_b.outbox"),
        "{said}"
    );
    assert!(
        said.contains("outbox[2].table"),
        "every table checked: {said}"
    );

    // The repair, then the backfill of that one table: its rows only, the unseen one too.
    pg.client_db("app")
        .batch_execute("ALTER PUBLICATION outbox_relay ADD TABLE tenant_b.outbox")
        .unwrap();
    let (status, stdout, stderr) = support::relay::run_command(
        &[
            "backfill",
            "--since",
            "-infinity",
            "--table",
            "tenant_b.outbox",
        ],
        &config,
        WAIT,
    );
    assert!(status.success(), "{stderr}");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    let sent = topics(&lines);
    assert_eq!(
        sent.keys().cloned().collect::<Vec<_>>(),
        {
            let mut ids = vec![first, unseen];
            ids.sort();
            ids
        },
        "tenant_b's rows, and only those"
    );
    assert!(
        sent.values().all(|topic| topic.starts_with("b.")),
        "{sent:?}"
    );
    assert!(
        plain(&stderr).contains("read from tenant_b.outbox"),
        "{stderr}"
    );

    // A table that is not one of the relay's is refused by name.
    let (status, _, stderr) = support::relay::run_command(
        &[
            "backfill",
            "--since",
            "-infinity",
            "--table",
            "tenant_c.outbox",
        ],
        &config,
        WAIT,
    );
    assert!(!status.success());
    assert!(
        plain(&stderr)
            .contains("--table tenant_c.outbox is not an outbox table of this configuration"),
        "{stderr}"
    );
}

#[test]
fn init_sets_up_every_table_and_the_relay_runs_on_it() {
    let pg = cluster_with_app_db();
    let config = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"tenant_a.outbox\"\n[[outbox]]\ntable = \"tenant_b.outbox\"\n",
        pg.url("outbox_relay", None, "app")
    );
    let admin = pg.url("postgres", None, "app");
    let (status, _, stderr) =
        support::relay::run_command(&["init", "--apply", "--admin-url", &admin], &config, WAIT);
    assert!(status.success(), "{stderr}");
    let (status, stdout, stderr) = support::relay::run_command(&["check"], &config, WAIT);
    assert!(status.success(), "{stdout}{stderr}");
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    // As the application role, which may only insert.
    let mut app = postgres::Config::new()
        .host("127.0.0.1")
        .port(pg.port())
        .user("app_writer")
        .dbname("app")
        .connect(postgres::NoTls)
        .expect("connecting as app_writer");
    let mut ids = Vec::new();
    for table in ["tenant_a.outbox", "tenant_b.outbox"] {
        let id: String = app
            .query_one("SELECT gen_random_uuid()::text", &[])
            .unwrap()
            .get(0);
        app.execute(
            &format!(
                "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) VALUES ($1::text::uuid, 'order', 'a', 'T', '{{}}')"
            ),
            &[&id],
        )
        .unwrap_or_else(|e| panic!("inserting into {table} as app_writer: {e}"));
        ids.push(id);
    }
    let lines = relay.wait_for_lines(2, WAIT);
    let mut seen: Vec<String> = topics(&lines).into_keys().collect();
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);
}

#[test]
fn a_pattern_relays_every_tenant_table_including_ones_created_while_it_runs() {
    let pg = cluster_with_app_db();
    let mut client = pg.client_db("app");
    client.batch_execute(OUTBOX_SQL).expect("public.outbox");
    for tenant in ["tenant_1", "tenant_2"] {
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {tenant}; CREATE TABLE {tenant}.outbox (LIKE public.outbox INCLUDING ALL);"
            ))
            .unwrap();
    }
    let (config, port) = with_metrics(&format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"public.outbox\"\n\
         [[outbox]]\ntable = \"tenant_*.outbox\"\ntopic = \"tenants.${{routedByValue}}\"\n\
         [sink]\ntype = \"stdout\"\n",
        pg.url("postgres", None, "app")
    ));
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let published = |table: &str| {
        let (schema, name) = table.split_once('.').unwrap();
        count(
            &pg,
            &format!(
                "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_relay' AND schemaname = '{schema}' AND tablename = '{name}'"
            ),
        ) == 1
    };
    assert!(published("tenant_1.outbox") && published("tenant_2.outbox"));

    let mut expected = BTreeMap::new();
    expected.insert(
        insert(&pg, "tenant_1.outbox", "T"),
        "tenants.order".to_owned(),
    );
    expected.insert(
        insert(&pg, "public.outbox", "T"),
        "outbox.event.order".to_owned(),
    );

    // A tenant provisioned while the relay runs, with a row written before the relay
    // could know of the table: the watch adds the table to the publication, its later
    // rows are streamed, and the earlier one is not (backfill sends it).
    let mut provisioning = pg.client_db("app");
    provisioning
        .batch_execute(
            "CREATE SCHEMA tenant_3; CREATE TABLE tenant_3.outbox (LIKE public.outbox INCLUDING ALL);",
        )
        .unwrap();
    let early: String = provisioning
        .query_one(
            "INSERT INTO tenant_3.outbox (aggregatetype, aggregateid, type, payload)
             VALUES ('order', 'o-0', 'Early', '{}') RETURNING id::text",
            &[],
        )
        .unwrap()
        .get(0);
    support::wait_until(
        "the relay adds tenant_3.outbox to the publication",
        WAIT,
        || published("tenant_3.outbox"),
    );
    expected.insert(
        insert(&pg, "tenant_3.outbox", "T"),
        "tenants.order".to_owned(),
    );
    let lines = relay.wait_for_lines(expected.len(), WAIT);
    assert_eq!(
        topics(&lines),
        expected,
        "every table's events, by its entry's rules"
    );
    assert!(
        !topics(&relay.lines()).contains_key(&early),
        "a row committed before its table joined the publication is not in the stream"
    );
    let stderr = plain(&relay.stderr());
    assert!(stderr.contains("joined the publication"), "{stderr}");
    assert!(
        stderr.contains("backfill --since -infinity --table tenant_3.outbox"),
        "the log says how the earlier rows are sent: {stderr}"
    );

    // A tenant offboarded: its table dropped. The relay goes on with the others.
    pg.client_db("app")
        .batch_execute("DROP SCHEMA tenant_1 CASCADE")
        .unwrap();
    let later = insert(&pg, "tenant_2.outbox", "T");
    support::wait_until("tenant_2's row after the drop arrives", WAIT, || {
        topics(&relay.lines()).contains_key(&later)
    });
    support::wait_until("the watch saw the drop", WAIT, || {
        plain(&relay.stderr()).contains("was dropped")
    });
    let after = insert(&pg, "tenant_3.outbox", "T");
    support::wait_until("a row after the drop was seen arrives", WAIT, || {
        topics(&relay.lines()).contains_key(&after)
    });
    assert_eq!(relay.exit_status(), None, "the relay runs on");
    relay.wait_metric(
        port,
        "outbox_relay_outbox_events_total{outbox=\"tenant_*.outbox\"}",
        "the pattern's events, under the pattern's label",
        WAIT,
        |n| n == 4,
    );

    // The backfill of the new tenant's table sends the early row.
    let (status, stdout, stderr) = support::relay::run_command(
        &[
            "backfill",
            "--since",
            "-infinity",
            "--table",
            "tenant_3.outbox",
        ],
        &config,
        WAIT,
    );
    assert!(status.success(), "{stderr}");
    let sent = topics(&stdout.lines().map(str::to_owned).collect::<Vec<_>>());
    assert!(sent.contains_key(&early), "{stdout}");
    // Every table the pattern matches now, and the listed one, in slot status.
    let (status, stdout, _) = support::relay::run_command(&["slot", "status"], &config, WAIT);
    assert!(status.success());
    for table in ["public.outbox", "tenant_2.outbox", "tenant_3.outbox"] {
        assert!(stdout.contains(&format!("{table} (published)")), "{stdout}");
    }
    assert!(!stdout.contains("tenant_1.outbox"), "{stdout}");
    // check looks at every table the pattern matches now, under the pattern's entry.
    let (status, stdout, stderr) = support::relay::run_command(&["check"], &config, WAIT);
    let said = plain(&format!("{stdout}{stderr}"));
    assert!(status.success(), "{said}");
    for table in ["tenant_2.outbox", "tenant_3.outbox"] {
        assert!(
            said.lines()
                .any(|line| line.contains("outbox[1].payload_column") && line.contains(table)),
            "{table} checked under outbox[1]: {said}"
        );
    }
}

/// A relay on the pattern `tenant_*.outbox` alone (stdout sink), streaming, with a
/// table for each of `tenants` (and `public.outbox`, the tables' model) made before it
/// started.
fn relay_on_tenants(pg: &PgCluster, tenants: &[&str]) -> RelayProcess {
    let client = &mut pg.client_db("app");
    client.batch_execute(OUTBOX_SQL).expect("public.outbox");
    for tenant in tenants {
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {tenant}; CREATE TABLE {tenant}.outbox (LIKE public.outbox INCLUDING ALL);"
            ))
            .unwrap();
    }
    let relay = RelayProcess::start(&format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"tenant_*.outbox\"\n\
         [sink]\ntype = \"stdout\"\n",
        pg.url("postgres", None, "app")
    ));
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    relay
}

/// A tenant's table dropped while the outbox watch reads the publication. On
/// PostgreSQL 16 and later, `pg_publication_tables` opens every table it lists; one
/// dropped between the listing and the open fails the read with `could not open
/// relation with OID …` (SQLSTATE XX000). Here the drop holds its lock, uncommitted,
/// until the watch's read waits for that lock, and commits then: the read fails every
/// time, not only when the race is lost by chance. The watch reads again, the table
/// leaves the relay's set, and the relay streams on.
#[test]
fn a_tenant_table_dropped_while_the_watch_reads_the_publication_stops_nothing() {
    let pg = cluster_with_app_db();
    let relay = relay_on_tenants(&pg, &["tenant_1", "tenant_2"]);
    let before = insert(&pg, "tenant_2.outbox", "T");
    support::wait_until("tenant_2's first row arrives", WAIT, || {
        topics(&relay.lines()).contains_key(&before)
    });

    let mut dropping = pg.client_db("app");
    dropping
        .batch_execute("BEGIN; DROP SCHEMA tenant_1 CASCADE")
        .expect("the drop, uncommitted");
    // A delivery makes the relay ask the watch; its read waits for the drop's lock.
    let during = insert(&pg, "tenant_2.outbox", "T");
    if support::outbox::publication_tables_opens_tables(&pg) {
        support::wait_until("the watch's read waits for the drop's lock", WAIT, || {
            support::outbox::watch_waits_for_a_lock(&pg)
        });
    }
    dropping.batch_execute("COMMIT").expect("the drop commits");

    let after = insert(&pg, "tenant_2.outbox", "T");
    support::wait_until(
        "tenant_2's rows during and after the drop arrive",
        WAIT,
        || {
            let seen = topics(&relay.lines());
            seen.contains_key(&during) && seen.contains_key(&after) || relay.exit_status().is_some()
        },
    );
    assert_eq!(
        relay.exit_status(),
        None,
        "the relay runs on: {}",
        plain(&relay.stderr())
    );
    let seen = topics(&relay.lines());
    assert!(seen.contains_key(&during) && seen.contains_key(&after));
    support::wait_until("the watch saw the drop", WAIT, || {
        plain(&relay.stderr()).contains("was dropped")
    });
}

/// A tenant's table dropped right after it was created, while the watch adds it to the
/// publication: its `ALTER PUBLICATION … ADD TABLE` waits for the drop's lock and then
/// finds no table. The relay streams on. To make the watch find the table before the
/// drop commits, every time: the watch is first held on its write of the state table
/// (a row lock) while the table is created and the drop begins, then let go.
#[test]
fn a_tenant_table_dropped_as_the_watch_adds_it_stops_nothing() {
    let pg = cluster_with_app_db();
    let relay = relay_on_tenants(&pg, &["tenant_1"]);
    let mut client = pg.client_db("app");
    let first = insert(&pg, "tenant_1.outbox", "T");
    support::wait_until("tenant_1's first row arrives", WAIT, || {
        topics(&relay.lines()).contains_key(&first)
    });
    let watch_waits_for_a_lock = |what: &str| {
        support::wait_until(what, WAIT, || support::outbox::watch_waits_for_a_lock(&pg));
    };

    // Hold the watch: its next record of the acknowledged position waits for the row.
    let mut holding = pg.client_db("app");
    holding
        .batch_execute("BEGIN; SELECT * FROM public.outbox_relay_state FOR UPDATE")
        .unwrap();
    let held = insert(&pg, "tenant_1.outbox", "T");
    watch_waits_for_a_lock("the watch's record waits for the state row");
    // The tenant comes and goes; its drop holds the table until the watch asks for it.
    client
        .batch_execute(
            "CREATE SCHEMA tenant_2; CREATE TABLE tenant_2.outbox (LIKE public.outbox INCLUDING ALL);",
        )
        .unwrap();
    let mut dropping = pg.client_db("app");
    dropping
        .batch_execute("BEGIN; DROP SCHEMA tenant_2 CASCADE")
        .expect("the drop, uncommitted");
    holding.batch_execute("COMMIT").unwrap();
    // A delivery asks the watch for a check: it finds tenant_2.outbox and adds it.
    let during = insert(&pg, "tenant_1.outbox", "T");
    watch_waits_for_a_lock("the watch's ALTER PUBLICATION waits for the drop's lock");
    dropping.batch_execute("COMMIT").expect("the drop commits");

    let after = insert(&pg, "tenant_1.outbox", "T");
    support::wait_until("tenant_1's rows arrive", WAIT, || {
        let seen = topics(&relay.lines());
        [&held, &during, &after]
            .iter()
            .all(|id| seen.contains_key(*id))
            || relay.exit_status().is_some()
    });
    assert_eq!(
        relay.exit_status(),
        None,
        "the relay runs on: {}",
        plain(&relay.stderr())
    );
}

#[test]
fn a_tenant_table_the_relay_may_not_publish_stops_it_with_the_statement_to_run() {
    let pg = cluster_with_app_db();
    pg.client_db("app")
        .batch_execute(
            "CREATE ROLE relay LOGIN REPLICATION;
             GRANT CREATE ON DATABASE app TO relay;
             GRANT USAGE, CREATE ON SCHEMA public TO relay;",
        )
        .unwrap();
    // Only a pattern, none of whose tables exists yet: a publication without tables.
    let config = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"tenant_*.outbox\"\n[sink]\ntype = \"stdout\"\n",
        pg.url("relay", None, "app")
    );
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    // A tenant provisioned by a role the relay's is not: the relay cannot add its table.
    pg.client_db("app")
        .batch_execute(
            "CREATE SCHEMA tenant_1; CREATE TABLE tenant_1.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
               aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb);",
        )
        .unwrap();
    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "the relay stops");
    let stderr = plain(&relay.stderr());
    assert!(
        stderr.contains("ALTER PUBLICATION \"outbox_relay\" ADD TABLE \"tenant_1\".\"outbox\"` as the owner of tenant_1.outbox"),
        "{stderr}"
    );
    assert!(
        stderr.contains("backfill --since -infinity --table tenant_1.outbox"),
        "{stderr}"
    );
    // Done as the message says, the relay starts and streams the tenant's rows.
    pg.client_db("app")
        .batch_execute("ALTER PUBLICATION outbox_relay ADD TABLE tenant_1.outbox")
        .unwrap();
    drop(relay);
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let id = insert(&pg, "tenant_1.outbox", "T");
    assert!(topics(&relay.wait_for_lines(1, WAIT)).contains_key(&id));
}

#[test]
fn a_partitioned_tenant_table_in_a_publication_without_the_root_option_stops_the_relay_with_it() {
    let pg = cluster_with_app_db();
    pg.client_db("app")
        .batch_execute(&format!(
            "{OUTBOX_SQL}; CREATE SCHEMA tenant_1; CREATE TABLE tenant_1.outbox (LIKE public.outbox INCLUDING ALL);"
        ))
        .unwrap();
    let config = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"tenant_*.outbox\"\n[sink]\ntype = \"stdout\"\n",
        pg.url("postgres", None, "app")
    );
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    // The publication was made for unpartitioned tables; a tenant arrives partitioned:
    // adopted, its identity (through the root, which the publication does not use) is
    // a change at the watch's next check.
    pg.client_db("app")
        .batch_execute(
            "CREATE SCHEMA tenant_2;
             CREATE TABLE tenant_2.outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
               aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())
               PARTITION BY RANGE (created_at);
             CREATE TABLE tenant_2.outbox_all PARTITION OF tenant_2.outbox DEFAULT;",
        )
        .unwrap();
    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "the relay stops");
    let stderr = plain(&relay.stderr());
    assert!(
        stderr
            .contains("ALTER PUBLICATION \"outbox_relay\" SET (publish_via_partition_root = true)"),
        "{stderr}"
    );
}
