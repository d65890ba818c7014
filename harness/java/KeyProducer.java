// Kafka's own Java producer, as an independent check of where a key lands: reads one
// key per line from stdin, sends each as a record (value "v") to the topic with the
// producer's default partitioner, and prints "key<TAB>partition" per record, in order.
// Run in Java's source-file mode by tests/kafka_relay.rs:
//   java -cp '<kafka libs>/*' harness/java/KeyProducer.java BOOTSTRAP TOPIC

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class KeyProducer {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: KeyProducer BOOTSTRAP TOPIC < keys");
            System.exit(2);
        }
        List<String> keys = new ArrayList<>();
        try (BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                if (!line.isEmpty()) {
                    keys.add(line);
                }
            }
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        props.put("acks", "all");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (String key : keys) {
                sent.add(producer.send(new ProducerRecord<>(args[1], key, "v")));
            }
            for (int i = 0; i < keys.size(); i++) {
                System.out.println(keys.get(i) + "\t" + sent.get(i).get().partition());
            }
        }
    }
}
