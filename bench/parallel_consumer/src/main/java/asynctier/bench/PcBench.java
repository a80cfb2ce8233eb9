package asynctier.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * One worker of Confluent Parallel Consumer draining a topic, as bench/kafka_peers.py runs
 * the Python peers: {@code PcBench BOOTSTRAP TOPIC GROUP WORK STATE_DIR}. WORK is noop (no
 * work) or sleep/asleep (1 ms: Thread.sleep, the JVM has no other natural form). Unordered,
 * MAX_CONCURRENCY records at once, offsets committed asynchronously every COMMIT_MS. It
 * writes STATE_DIR.ready once built, waits for STATE_DIR/../go, and runs until SIGTERM.
 */
public final class PcBench {
  static final int MAX_CONCURRENCY = 64;
  static final long COMMIT_MS = 500;

  public static void main(String[] args) throws Exception {
    String bootstrap = args[0], topic = args[1], group = args[2], work = args[3];
    Path state = Path.of(args[4]);
    boolean sleeps = !work.equals("noop");
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
    ParallelConsumerOptions<byte[], byte[]> options =
        ParallelConsumerOptions.<byte[], byte[]>builder()
            .ordering(ProcessingOrder.UNORDERED)
            .maxConcurrency(MAX_CONCURRENCY)
            .commitMode(CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS)
            .commitInterval(Duration.ofMillis(COMMIT_MS))
            .consumer(consumer)
            .build();
    Files.createFile(Path.of(state + ".ready"));
    Path go = state.getParent().resolve("go");
    long deadline = System.nanoTime() + Duration.ofSeconds(180).toNanos();
    while (!Files.exists(go)) {
      if (System.nanoTime() > deadline) {
        throw new IllegalStateException("no " + go + " after 180 s");
      }
      Thread.sleep(10);
    }
    ParallelStreamProcessor<byte[], byte[]> pc =
        ParallelStreamProcessor.createEosStreamProcessor(options);
    pc.subscribe(List.of(topic));
    CountDownLatch stop = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      pc.closeDrainFirst(Duration.ofSeconds(20));
      stop.countDown();
    }));
    pc.poll(ctx -> {
      if (sleeps) {
        try {
          Thread.sleep(1);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
    });
    stop.await();
  }
}
