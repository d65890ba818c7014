//! Topics on a test broker: list them (metadata), create one or add partitions and wait
//! until metadata shows every partition with a leader, delete all of them for the next
//! lease of the shared broker; and `block_on` for the admin client's futures.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use rdkafka::types::RDKafkaErrorCode;

use super::{base_config, metadata_client, topic_partitions, METADATA_TIMEOUT};
use crate::wait::poll_until;

/// Deadline for topic creation and for its partitions to show up in metadata.
const CREATE_TOPIC_TIMEOUT: Duration = Duration::from_secs(30);

/// Every topic name the broker lists in its metadata, sorted.
pub fn list_topics(bootstrap: &str) -> Vec<String> {
    let metadata = metadata_client(bootstrap)
        .fetch_metadata(None, METADATA_TIMEOUT)
        .unwrap_or_else(|err| panic!("metadata request to {bootstrap}: {err}"));
    let mut names: Vec<String> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| t.name().to_owned())
        .collect();
    names.sort();
    names
}

/// Creates `name` with `partitions` partitions (replication factor 1) and waits until
/// metadata shows all of them with a leader. Panics on any error, "already exists"
/// included.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap)
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka admin client for {bootstrap}: {err}"));
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TOPIC_TIMEOUT))
        .operation_timeout(Some(CREATE_TOPIC_TIMEOUT));
    let results = block_on(admin.create_topics([&topic], &options))
        .unwrap_or_else(|err| panic!("creating topic {name:?} on {bootstrap}: {err}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("creating topic {topic:?} on {bootstrap}: {code}");
        }
    }
    let client = metadata_client(bootstrap);
    let want = usize::try_from(partitions).expect("partition count is positive");
    let found = poll_until(CREATE_TOPIC_TIMEOUT, || {
        (topic_partitions(&client, name, METADATA_TIMEOUT).len() >= want).then_some(())
    });
    if found.is_none() {
        panic!(
            "topic {name:?} created on {bootstrap} but its {partitions} partitions did not \
             show up in metadata within {CREATE_TOPIC_TIMEOUT:?}"
        );
    }
}

/// Grows `topic` to `total` partitions and waits until metadata shows them all with a
/// leader. Panics on any error.
pub fn add_partitions(bootstrap: &str, topic: &str, total: usize) {
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap)
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka admin client for {bootstrap}: {err}"));
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TOPIC_TIMEOUT))
        .operation_timeout(Some(CREATE_TOPIC_TIMEOUT));
    let results = block_on(admin.create_partitions([&NewPartitions::new(topic, total)], &options))
        .unwrap_or_else(|err| panic!("adding partitions to {topic:?} on {bootstrap}: {err}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("adding partitions to {topic:?} on {bootstrap}: {code}");
        }
    }
    let client = metadata_client(bootstrap);
    let found = poll_until(CREATE_TOPIC_TIMEOUT, || {
        (topic_partitions(&client, topic, METADATA_TIMEOUT).len() >= total).then_some(())
    });
    assert!(
        found.is_some(),
        "{topic:?} on {bootstrap} did not show {total} partitions within {CREATE_TOPIC_TIMEOUT:?}"
    );
}

/// Deletes every topic that is not internal (`__…`) and waits until metadata lists none
/// of them: the shared broker looks fresh to the next test.
pub fn delete_all_topics(bootstrap: &str) {
    let names: Vec<String> = list_topics(bootstrap)
        .into_iter()
        .filter(|name| !name.starts_with("__"))
        .collect();
    if names.is_empty() {
        return;
    }
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap)
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka admin client for {bootstrap}: {err}"));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TOPIC_TIMEOUT))
        .operation_timeout(Some(CREATE_TOPIC_TIMEOUT));
    let results = block_on(admin.delete_topics(&refs, &options))
        .unwrap_or_else(|err| panic!("deleting topics {names:?} on {bootstrap}: {err}"));
    for result in results {
        if let Err((topic, code)) = result {
            if code != RDKafkaErrorCode::UnknownTopicOrPartition {
                panic!("deleting topic {topic:?} on {bootstrap}: {code}");
            }
        }
    }
    let gone = poll_until(CREATE_TOPIC_TIMEOUT, || {
        let left: Vec<String> = list_topics(bootstrap)
            .into_iter()
            .filter(|name| names.contains(name))
            .collect();
        left.is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "topics {names:?} deleted on {bootstrap} but still listed after {CREATE_TOPIC_TIMEOUT:?}"
    );
}

/// Runs a future to completion on the current thread. The admin client's futures are
/// completed by librdkafka's own threads, so no async runtime is needed (and these
/// helpers work even when called from inside one).
fn block_on<F: Future>(future: F) -> F::Output {
    struct ThreadWaker(Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}
