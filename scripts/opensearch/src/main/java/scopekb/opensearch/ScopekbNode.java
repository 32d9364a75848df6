package scopekb.opensearch;

import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.index.mapper.MapperExtrasPlugin;
import org.opensearch.index.reindex.ReindexPlugin;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * A single OpenSearch 2.19 node for local development and tests, started by {@code scripts/services}.
 *
 * <p>The core jars and the simple modules (netty4 transport, mapper-extras, reindex) are on the JVM classpath
 * and are handed to {@link Node} as classpath plugins. Modules and plugins that take part in plugin extension
 * need their own class loader: lang-painless (extensible), analysis-common and the k-NN plugin (both extend
 * lang-painless). {@code scripts/services} lays those out under {@code <home>/modules} and
 * {@code <home>/plugins} with their descriptors, as in the distribution, and the node's PluginsService loads
 * them from there (so {@code _cat/plugins} names the k-NN plugin {@code opensearch-knn}).
 *
 * <p>Usage: {@code java -cp <classes>:<lib>/* scopekb.opensearch.ScopekbNode <path.home>}; settings are read
 * from {@code <path.home>/config/opensearch.yml} and logging from {@code <path.home>/config/log4j2.properties}.
 */
public final class ScopekbNode extends Node {

    static final List<Class<? extends Plugin>> CLASSPATH_PLUGINS = List.of(
        Netty4Plugin.class,
        MapperExtrasPlugin.class,
        ReindexPlugin.class
    );

    ScopekbNode(Environment environment, Collection<Class<? extends Plugin>> classpathPlugins) {
        // forbidPrivateIndexSettings=true, as in a normal node
        super(environment, classpathPlugins, true);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: ScopekbNode <path.home>");
            System.exit(2);
        }
        Path home = Paths.get(args[0]).toAbsolutePath().normalize();
        Settings input = Settings.builder().put(Environment.PATH_HOME_SETTING.getKey(), home.toString()).build();
        Environment environment = InternalSettingsPreparer.prepareEnvironment(
            input, Collections.emptyMap(), home.resolve("config"), () -> "scopekb-node");

        LogConfigurator.registerErrorListener();
        LogConfigurator.setNodeName(Node.NODE_NAME_SETTING.get(environment.settings()));
        LogConfigurator.configure(environment);

        Thread.setDefaultUncaughtExceptionHandler((thread, error) -> {
            System.err.println("uncaught exception in thread [" + thread.getName() + "]");
            error.printStackTrace();
            if (error instanceof VirtualMachineError) {
                // like OpenSearch's own handler: the JVM is in an unknown state
                Runtime.getRuntime().halt(1);
            }
        });

        final ScopekbNode node;
        try {
            node = new ScopekbNode(environment, CLASSPATH_PLUGINS);
            node.start();
        } catch (Throwable t) {
            System.err.println("scopekb-node failed to start: " + t);
            t.printStackTrace();
            System.exit(1);
            return;
        }

        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                stopped.countDown();
            }
        }, "scopekb-node-shutdown"));
        stopped.await();
    }
}
