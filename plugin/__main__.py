from plugin.cli import main

raise SystemExit(main())
