from moetier.cli.main import main

raise SystemExit(main())
