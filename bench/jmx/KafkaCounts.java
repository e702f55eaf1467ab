import com.sun.tools.attach.VirtualMachine;
import javax.management.*;
import javax.management.remote.*;
import java.util.*;

/** Prints the broker's cumulative request counts by type, and records and bytes in by
 *  topic, a line each: "requests|records|bytes name count" (bench/broker_cost.py). */
public class KafkaCounts {
    public static void main(String[] args) throws Exception {
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        String address = vm.startLocalManagementAgent();
        vm.detach();
        try (JMXConnector c = JMXConnectorFactory.connect(new JMXServiceURL(address))) {
            MBeanServerConnection s = c.getMBeanServerConnection();
            Map<String, Long> requests = new TreeMap<>();
            for (ObjectName n : s.queryNames(new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*"), null)) {
                requests.merge(n.getKeyProperty("request"), (Long) s.getAttribute(n, "Count"), Long::sum);
            }
            requests.forEach((k, v) -> System.out.println("requests " + k + " " + v));
            for (ObjectName n : s.queryNames(new ObjectName("kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,*"), null)) {
                String t = n.getKeyProperty("topic");
                System.out.println("records " + (t == null ? "ALL" : t) + " " + s.getAttribute(n, "Count"));
            }
            for (ObjectName n : s.queryNames(new ObjectName("kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec,*"), null)) {
                String t = n.getKeyProperty("topic");
                System.out.println("bytes " + (t == null ? "ALL" : t) + " " + s.getAttribute(n, "Count"));
            }
        }
    }
}
